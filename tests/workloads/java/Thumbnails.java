// An off-heap leak: each request renders a thumbnail into a direct buffer (off the Java heap:
// Unsafe.allocateMemory, the JVM's os::malloc) and keeps it in a cache nothing evicts; the Java
// heap holds only the small ByteBuffer objects. The native stacks of the allocations run from
// libjvm.so's os::malloc up through the JDK's ByteBuffer.allocateDirect to thumbnail(int), JIT-compiled.
// args: thumbnails per second (default 500), bytes per thumbnail (default 8192).
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

public class Thumbnails {
    static final List<ByteBuffer> rendered = new ArrayList<>();

    static ByteBuffer thumbnail(int id, int bytes) {
        ByteBuffer b = ByteBuffer.allocateDirect(bytes);
        for (int i = 0; i < bytes; i += 64) {
            b.put(i, (byte) id);
        }
        return b;
    }

    public static void main(String[] args) throws InterruptedException {
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 500;
        int bytes = args.length > 1 ? Integer.parseInt(args[1]) : 8192;
        System.out.println("ready");
        System.out.flush();
        Pacer pacer = new Pacer(rate);
        for (int id = 1; ; id++) {
            rendered.add(thumbnail(id, bytes));
            pacer.step();
        }
    }
}
