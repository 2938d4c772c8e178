"""mysql-connector-python (pure Python) through holdfast.

Usage: connector_check.py HOST PORT USER PASSWORD DATABASE
Exit 0 when every check passes, 77 when the module is not installed.
"""
import sys

try:
    import mysql.connector
except ImportError:
    print("SKIP: mysql-connector-python is not installed (pip install mysql-connector-python)")
    sys.exit(77)

host, port, user, password, database = sys.argv[1:6]


def connect(**extra):
    return mysql.connector.connect(
        host=host, port=int(port), user=user, password=password, database=database,
        use_pure=True, connection_timeout=10, autocommit=True, **extra)


cnx = connect()
cur = cnx.cursor()

# Text queries.
cur.execute("SELECT 1 + 1, 'héllo 😀', NULL")
assert cur.fetchall() == [(2, "héllo 😀", None)], "text select"
cur.execute("CREATE TABLE py_t (id INT PRIMARY KEY, v VARCHAR(50), d DECIMAL(10,2)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")

# Prepared statements with parameters (binary protocol).
pcur = cnx.cursor(prepared=True)
pcur.execute("INSERT INTO py_t VALUES (?, ?, ?)", (1, "one", "1.50"))
pcur.execute("INSERT INTO py_t VALUES (?, ?, ?)", (2, "twö 😀", "-2.25"))
pcur.execute("SELECT id, v, d FROM py_t WHERE id >= ? ORDER BY id", (1,))
rows = pcur.fetchall()
assert [(r[0], r[1], str(r[2])) for r in rows] == [(1, "one", "1.50"), (2, "twö 😀", "-2.25")], rows
pcur.execute("SELECT ? IS NULL", (None,))
assert pcur.fetchall()[0][0] == 1
pcur.close()

# Transactions: rollback discards, commit keeps.
cnx.autocommit = False
cur.execute("INSERT INTO py_t VALUES (3, 'three', 3)")
cnx.rollback()
cur.execute("SELECT COUNT(*) FROM py_t")
assert cur.fetchone()[0] == 2, "rollback"
cnx.rollback()
cnx.autocommit = True
cnx.start_transaction()
cur.execute("INSERT INTO py_t VALUES (3, 'three', 3)")
cnx.commit()

# Autocommit toggle, seen from another connection.
cnx.autocommit = True
cur.execute("SELECT @@autocommit")
assert cur.fetchone()[0] == 1
cur.execute("INSERT INTO py_t VALUES (4, 'four', 4)")
other = connect()
ocur = other.cursor()
ocur.execute("SELECT COUNT(*) FROM py_t")
assert ocur.fetchone()[0] == 4, "autocommit insert visible elsewhere"

# executemany (batched into one multi-row INSERT by the driver).
cur.executemany("INSERT INTO py_t (id, v, d) VALUES (%s, %s, %s)", [(i, f"m{i}", i / 4) for i in range(10, 110)])
assert cur.rowcount == 100, cur.rowcount
cur.execute("SELECT COUNT(*), SUM(id) FROM py_t WHERE id >= 10")
assert cur.fetchone() == (100, sum(range(10, 110)))

# An error, then the connection goes on.
try:
    cur.execute("SELECT * FROM no_such_table")
    raise AssertionError("error expected")
except mysql.connector.Error as e:
    assert e.errno == 1146, e
cur.execute("SELECT 'ok'")
assert cur.fetchone() == ("ok",)
cnx.cmd_reset_connection()
cnx.ping(reconnect=False)
other.close()
cnx.close()
print("connector: all checks passed")
