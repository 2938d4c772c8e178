"""A mysql-connector-python session whose state must survive a switchover.

Usage: keepalive_state.py HOST PORT USER PASSWORD DATABASE
Sets session state (variables, user variables, schema, a server-side prepared statement),
prints READY, waits for a line on stdin (the test switches the primary over meanwhile), then
checks that the same connection sees the same state on the new node and prints DONE.
Exit 77 when the module is not installed.
"""
import sys

try:
    import mysql.connector
except ImportError:
    print("SKIP: mysql-connector-python is not installed (pip install mysql-connector-python)")
    sys.exit(77)

host, port, user, password, database = sys.argv[1:6]
cnx = mysql.connector.connect(host=host, port=int(port), user=user, password=password,
                              database=database, use_pure=True, autocommit=True)
cur = cnx.cursor()
cur.execute("SET sql_mode='ANSI_QUOTES', time_zone='-03:00', NAMES utf8mb4 COLLATE utf8mb4_bin")
cur.execute("SET @big = 18446744073709551615, @txt = 'héllo 😀', @nothing = NULL, @dec = 12.500")
cur.execute("CREATE TABLE IF NOT EXISTS ka_py (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
cur.execute("INSERT INTO ka_py (v) VALUES (7)")
STATE = ("SELECT @@port, @@sql_mode, @@time_zone, @@collation_connection, @big, @txt, @nothing, "
         "CAST(@dec AS CHAR), DATABASE(), LAST_INSERT_ID()")
cur.execute(STATE)
before = cur.fetchone()
pcur = cnx.cursor(prepared=True)
PREP = "SELECT CAST(? AS SIGNED) * 2, CONVERT(@txt USING utf8mb4)"
pcur.execute(PREP, (21,))
got = [tuple(v.decode() if isinstance(v, (bytes, bytearray)) else v for v in r) for r in pcur.fetchall()]
assert got == [(42, "héllo 😀")], f"prepared before: {got!r}"
print("READY", flush=True)
sys.stdin.readline()

cur.execute(STATE)
after = cur.fetchone()
assert after[0] != before[0], f"still on port {before[0]}: the session did not move"
assert after[1:] == before[1:], f"state differs: before {before[1:]} after {after[1:]}"
pcur.execute(PREP, (50,))
got = [tuple(v.decode() if isinstance(v, (bytes, bytearray)) else v for v in r) for r in pcur.fetchall()]
assert got == [(100, "héllo 😀")], f"prepared after: {got!r}"
cur.execute("INSERT INTO ka_py (v) VALUES (8)")
cur.execute("SELECT COUNT(*) FROM ka_py")
assert cur.fetchone() == (2,), "rows"
print("DONE", flush=True)
