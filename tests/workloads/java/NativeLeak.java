// A JNI library that leaks: each order is recorded by native code (libnativeleak.so, C) that keeps
// one record in seven in a buffer it never frees and drops the pointer; the Java heap stays flat.
// args: orders per second (default 2000), bytes per record (default 4096).
public class NativeLeak {
    static native long recordOrder(long id, int bytes);

    public static void main(String[] args) throws InterruptedException {
        System.loadLibrary("nativeleak");
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 2000;
        int bytes = args.length > 1 ? Integer.parseInt(args[1]) : 4096;
        System.out.println("ready");
        System.out.flush();
        Pacer pacer = new Pacer(rate);
        long sum = 0;
        for (long id = 1; ; id++) {
            sum += recordOrder(id, bytes);
            pacer.step();
        }
    }
}
