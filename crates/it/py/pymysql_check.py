"""PyMySQL through holdfast.

Usage: pymysql_check.py HOST PORT USER PASSWORD DATABASE
Exit 0 when every check passes, 77 when the module is not installed.
"""
import sys

try:
    import pymysql
    import pymysql.constants.CLIENT
except ImportError:
    print("SKIP: PyMySQL is not installed (pip install pymysql)")
    sys.exit(77)

host, port, user, password, database = sys.argv[1:6]
cnx = pymysql.connect(host=host, port=int(port), user=user, password=password, database=database,
                      charset="utf8mb4", connect_timeout=10, autocommit=True,
                      client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS)
cur = cnx.cursor()
cur.execute("SELECT %s, %s, %s", (1, "héllo 😀", None))
assert cur.fetchone() == (1, "héllo 😀", None)
cur.execute("CREATE TABLE pm_t (id INT PRIMARY KEY, b BLOB)")
blob = bytes(range(256)) * 8
cur.executemany("INSERT INTO pm_t VALUES (%s, %s)", [(i, blob) for i in range(50)])
assert cur.rowcount == 50
cnx.begin()
cur.execute("DELETE FROM pm_t WHERE id < 10")
cnx.rollback()
cur.execute("SELECT COUNT(*), MIN(b) = MAX(b), LENGTH(MAX(b)) FROM pm_t")
assert cur.fetchone() == (50, 1, 2048)
cur.execute("SELECT b FROM pm_t WHERE id = 7")
assert cur.fetchone()[0] == blob
cur.execute("SELECT 1; SELECT 2")
assert cur.fetchall() == ((1,),)
assert cur.nextset()
assert cur.fetchall() == ((2,),)
cnx.ping(reconnect=False)
cnx.select_db("mysql")
cur.execute("SELECT DATABASE()")
assert cur.fetchone() == ("mysql",)
cnx.close()
print("pymysql: all checks passed")
