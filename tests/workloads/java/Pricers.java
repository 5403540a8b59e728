// Threads pricing orders flat out beside a service's own work: a service that keeps its CPUs busy
// (one such thread per CPU keeps them all busy). Each thread hashes its own small table forever
// and keeps nothing.
public final class Pricers {
    static volatile long priced;

    private Pricers() {}

    public static void start(int threads) {
        for (int i = 0; i < threads; i++) {
            Thread t = new Thread(Pricers::price, "pricer-" + i);
            t.setDaemon(true);
            t.start();
        }
    }

    static void price() {
        long[] book = new long[4096];
        for (long n = 1; ; n++) {
            long h = n;
            for (int i = 0; i < book.length; i++) {
                h = h * 31 + book[i];
                book[i] = h;
            }
            priced = h;
        }
    }
}
