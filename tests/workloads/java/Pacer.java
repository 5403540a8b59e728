// Paces a loop at a rate of steps per second, sleeping in 10 ms slices (never spinning).
public final class Pacer {
    private final long nanosPerStep;
    private final long start = System.nanoTime();
    private long steps;

    public Pacer(int perSecond) {
        nanosPerStep = 1_000_000_000L / Math.max(1, perSecond);
    }

    public void step() throws InterruptedException {
        steps++;
        long ahead = start + steps * nanosPerStep - System.nanoTime();
        if (ahead > 10_000_000L) {
            Thread.sleep(ahead / 1_000_000L);
        }
    }
}
