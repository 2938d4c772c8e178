// An idle pooled JDBC connection (MariaDB Connector/J) across holdfast upgrades, driven by
// crates/holdfast/tests/upgrade.rs: it connects over TLS, sets session state and prepares a
// statement, prints what it sees, then prints it again for each line on its standard input
// ("check"), the same connection throughout (no reconnect: autoReconnect is off).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;

public class UpgradeIdle {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:mariadb://127.0.0.1:" + args[0] + "/sbtest?user=app&password=app_pass"
            + "&useSsl=true&serverSslCert=" + args[1] + "&useServerPrepStmts=true";
        try (Connection c = DriverManager.getConnection(url)) {
            try (Statement s = c.createStatement()) {
                s.execute("SET @kept = 'jdbc', time_zone = '+05:00'");
            }
            PreparedStatement ps = c.prepareStatement("SELECT CONNECTION_ID(), @kept, @@time_zone, ? + 1");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            String line = "check";
            while (line != null && line.equals("check")) {
                ps.setInt(1, 41);
                try (ResultSet r = ps.executeQuery()) {
                    r.next();
                    System.out.println(r.getLong(1) + " " + r.getString(2) + " " + r.getString(3) + " " + r.getInt(4));
                    System.out.flush();
                }
                line = in.readLine();
            }
        }
    }
}
