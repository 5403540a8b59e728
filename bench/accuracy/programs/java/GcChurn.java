/** A request loop that makes lots of short-lived garbage over a small, fixed live set: the heap
 * rises and falls with each collection (a GC sawtooth). java GcChurn RATE */
public class GcChurn {
    static final byte[][] LIVE = new byte[512][];

    static int handle(int n) {
        byte[] scratch = new byte[16 * 1024];
        scratch[n % scratch.length] = (byte) n;
        LIVE[n % LIVE.length] = new byte[1024];
        return scratch[n % scratch.length];
    }

    public static void main(String[] args) throws Exception {
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 20000;
        System.out.println("ready " + ProcessHandle.current().pid());
        long sink = 0;
        int n = 0;
        while (true) {
            for (int i = 0; i < rate / 100; i++) sink += handle(n++);
            Thread.sleep(10);
            if (sink == Long.MIN_VALUE) System.out.println(sink);
        }
    }
}
