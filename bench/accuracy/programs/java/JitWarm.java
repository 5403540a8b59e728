import java.util.ArrayList;
import java.util.List;
import java.util.function.LongUnaryOperator;

/** A service just started: it runs its many code paths for the first time, so the JIT compiles
 * them (the code cache and the compiler's arenas grow) while its data stay the same. Diagnosed
 * from the moment it is ready. java JitWarm */
public class JitWarm {
    public static void main(String[] args) throws Exception {
        List<LongUnaryOperator> paths = new ArrayList<>();
        for (int k = 0; k < 400; k++) {
            final int m = k;
            paths.add(x -> Long.rotateLeft(x * (m + 3), m % 63) ^ (x >>> (m % 17)));
            paths.add(x -> Long.toString(x + m).hashCode() * 31L + m);
            paths.add(x -> (x % (m + 7)) * (x / (m + 11) + 1));
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        long sink = 1;
        int round = 0;
        while (true) {
            int upto = Math.min(paths.size(), 40 + round * 8);  // new paths come into use over time
            for (int i = 0; i < upto; i++) sink = paths.get(i).applyAsLong(sink) | 1;
            round++;
            Thread.sleep(20);
            if (sink == 0) System.out.println(sink);
        }
    }
}
