// A client of a real H2 database server (Debian's libh2-java, run as its own JVM): it creates an
// in-memory table and inserts orders into it at a steady rate, never deleting any, so the server's
// Java heap holds every row. args: JDBC URL, rows per second (default 500), bytes per row (default 1024).
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.Statement;

public class H2Feeder {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        int rate = args.length > 1 ? Integer.parseInt(args[1]) : 500;
        int bytes = args.length > 2 ? Integer.parseInt(args[2]) : 1024;
        try (Connection c = DriverManager.getConnection(url, "sa", "")) {
            try (Statement s = c.createStatement()) {
                s.execute("CREATE TABLE IF NOT EXISTS orders(id BIGINT PRIMARY KEY, payload VARCHAR)");
            }
            String payload = "x".repeat(bytes);
            System.out.println("ready");
            System.out.flush();
            Pacer pacer = new Pacer(rate);
            try (PreparedStatement insert = c.prepareStatement("INSERT INTO orders VALUES (?, ?)")) {
                for (long id = 1; ; id++) {
                    insert.setLong(1, id);
                    insert.setString(2, payload + id);
                    insert.executeUpdate();
                    pacer.step();
                }
            }
        }
    }
}
