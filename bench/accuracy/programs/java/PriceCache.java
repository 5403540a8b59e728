import java.util.LinkedHashMap;
import java.util.Map;

/** Quotes memoised in an LRU of 20,000 entries (a LinkedHashMap in access order that drops its
 * eldest), filled to its bound before the ready line; then new keys evict old ones at RATE a second.
 * java PriceCache RATE */
public class PriceCache {
    static final int BOUND = 20_000;
    static final Map<Long, byte[]> QUOTES =
            new LinkedHashMap<>(BOUND, 0.75f, true) {
                @Override
                protected boolean removeEldestEntry(Map.Entry<Long, byte[]> eldest) {
                    return size() > BOUND;
                }
            };

    static byte[] quote(long sku) {
        return QUOTES.computeIfAbsent(sku, k -> new byte[700]);
    }

    public static void main(String[] args) throws Exception {
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 2000;
        long sku = 0;
        while (sku < BOUND) quote(sku++);
        System.out.println("ready " + ProcessHandle.current().pid());
        while (true) {
            for (int i = 0; i < rate / 50; i++) quote(sku++);
            Thread.sleep(20);
        }
    }
}
