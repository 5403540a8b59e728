// The seed's incident: an order service whose error branch parks each failed batch's 16 KiB
// buffer in a static retry list that nothing drains. args: batches per second (default 1000),
// one batch in N fails (default 8): about 2 MiB/s retained at the defaults; threads pricing
// orders flat out beside it (default 0, Pricers.java): a service that keeps its CPUs busy.
import java.util.ArrayList;
import java.util.List;

public class OrderService {
    static final List<byte[]> retryQueue = new ArrayList<>();
    static long processed;

    static byte[] processBatch(int batch) {
        byte[] buffer = new byte[16384];
        buffer[batch % buffer.length] = (byte) batch;
        return buffer;
    }

    static void handle(int batch, int failEvery) {
        byte[] buffer = processBatch(batch);
        if (batch % failEvery == 0) {
            retryQueue.add(buffer); // retried "later": never
        }
        processed += buffer.length;
    }

    public static void main(String[] args) throws InterruptedException {
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 1000;
        int failEvery = args.length > 1 ? Integer.parseInt(args[1]) : 8;
        Pricers.start(args.length > 2 ? Integer.parseInt(args[2]) : 0);
        System.out.println("ready");
        System.out.flush();
        Pacer pacer = new Pacer(rate);
        for (int batch = 1; ; batch++) {
            handle(batch, failEvery);
            pacer.step();
        }
    }
}
