import java.util.ArrayList;
import java.util.List;

/** A support desk that keeps every ticket it opens in a static list and never closes one (held
 * growth). java TicketStore RATE */
public class TicketStore {
    static final List<Ticket> OPEN = new ArrayList<>();

    static final class Ticket {
        final long id;
        final byte[] notes = new byte[800];

        Ticket(long id) {
            this.id = id;
        }
    }

    static void openTicket(long id) {
        OPEN.add(new Ticket(id));
    }

    public static void main(String[] args) throws Exception {
        int rate = args.length > 0 ? Integer.parseInt(args[0]) : 2000;
        System.out.println("ready " + ProcessHandle.current().pid());
        long id = 0;
        while (true) {
            for (int i = 0; i < rate / 50; i++) openTicket(id++);
            Thread.sleep(20);
        }
    }
}
