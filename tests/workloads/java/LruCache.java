// A bounded LRU cache: a LinkedHashMap in access order holding at most CAPACITY entries of
// 16 KiB (64 MiB at the default 4,000), looked up with keys drawn over three times its size: it
// fills in a few seconds, then about two lookups in three miss, load a fresh value and evict the
// eldest: turnover at its bound. args: lookups per second (default 1000), capacity (default 4000),
// threads pricing flat out beside it (default 0, Pricers.java).
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;

public class LruCache {
    static final class Cache extends LinkedHashMap<Integer, byte[]> {
        private final int capacity;

        Cache(int capacity) {
            super(16, 0.75f, true);
            this.capacity = capacity;
        }

        @Override
        protected boolean removeEldestEntry(Map.Entry<Integer, byte[]> eldest) {
            return size() > capacity;
        }
    }

    static Cache cache;

    static byte[] load(int key) {
        byte[] value = new byte[16384];
        value[key % value.length] = (byte) key;
        return value;
    }

    static byte[] lookup(int key) {
        byte[] value = cache.get(key);
        if (value == null) {
            value = load(key);
            cache.put(key, value);
        }
        return value;
    }

    public static void main(String[] args) throws InterruptedException {
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 1000;
        int capacity = args.length > 1 ? Integer.parseInt(args[1]) : 4000;
        cache = new Cache(capacity);
        Pricers.start(args.length > 2 ? Integer.parseInt(args[2]) : 0);
        Random random = new Random(42);
        System.out.println("ready");
        System.out.flush();
        Pacer pacer = new Pacer(rate);
        long sum = 0;
        while (true) {
            sum += lookup(random.nextInt(capacity * 3)).length;
            pacer.step();
        }
    }
}
