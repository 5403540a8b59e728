// A heap near its maximum: a live set that climbs to nearly all of -Xmx (records kept in a static
// list) while the program keeps allocating short-lived garbage, so the collector runs back to
// back for less and less room: GC time climbs before an OutOfMemoryError would come. args: the
// share of the heap to keep before "ready" (default 70%), the share to stop at (default 88%: what
// it keeps counts its arrays, not the list's own, so about 92% of the heap is live there), the
// percent per second it climbs meanwhile (default 0.4).
import java.util.ArrayList;
import java.util.List;

public class HeapThrash {
    static final List<long[]> records = new ArrayList<>();
    static long sink;

    static long used() {
        Runtime rt = Runtime.getRuntime();
        return rt.totalMemory() - rt.freeMemory();
    }

    static void keep(long bytes) {
        for (long kept = 0; kept < bytes; kept += 8 * 1024 + 16) {
            records.add(new long[1024]);
        }
    }

    static void churn(int n) {
        for (int i = 0; i < n; i++) {
            long[] garbage = new long[128];
            garbage[i % garbage.length] = i;
            sink += garbage[(i * 7) % garbage.length];
        }
    }

    public static void main(String[] args) throws InterruptedException {
        double start = args.length > 0 ? Double.parseDouble(args[0]) / 100 : 0.70;
        double stop = args.length > 1 ? Double.parseDouble(args[1]) / 100 : 0.88;
        double perSecond = args.length > 2 ? Double.parseDouble(args[2]) / 100 : 0.004;
        long max = Runtime.getRuntime().maxMemory();
        keep((long) (max * start));
        System.out.println("ready");
        System.out.flush();
        long kept = (long) (max * start);
        long began = System.nanoTime();
        while (true) {
            double seconds = (System.nanoTime() - began) / 1e9;
            long target = (long) (max * Math.min(stop, start + perSecond * seconds));
            if (target > kept) {
                keep(target - kept);
                kept = target;
            }
            churn(20_000);
            Thread.sleep(5);
        }
    }
}
