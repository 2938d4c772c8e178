"""An idle pooled PyMySQL connection (TLS to holdfast) across holdfast upgrades.

Usage: upgrade_idle.py HOST PORT USER PASSWORD DATABASE CA
Sets session state (variables, user variables, an SQL prepared statement, a temporary
table, LAST_INSERT_ID), then answers each line on stdin: "state" prints one line of what
the session sees (CONNECTION_ID() included), "quit" ends. Exit 77 when PyMySQL is missing.
"""
import json
import ssl
import sys

try:
    import pymysql
except ImportError:
    print("SKIP: PyMySQL is not installed (apt-get install python3-pymysql)")
    sys.exit(77)

host, port, user, password, database, ca = sys.argv[1:7]
context = ssl.create_default_context(cafile=ca)
cnx = pymysql.connect(host=host, port=int(port), user=user, password=password,
                      database=database, ssl=context, autocommit=True)
cur = cnx.cursor()
cur.execute("SET sql_mode='ANSI_QUOTES', time_zone='-03:00', NAMES utf8mb4 COLLATE utf8mb4_bin")
cur.execute("SET @txt = 'héllo 😀', @dec = 12.500")
cur.execute("CREATE TEMPORARY TABLE py_tmp (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
cur.execute("INSERT INTO py_tmp (v) VALUES (7), (8)")
cur.execute("PREPARE twice FROM 'SELECT CAST(? AS SIGNED) * 2'")
cur.execute("SELECT Variable_value FROM information_schema.SESSION_STATUS WHERE Variable_name = 'Ssl_cipher'")
cipher = cur.fetchone()[0]


def state():
    cur.execute("SELECT CONNECTION_ID(), @@sql_mode, @@time_zone, @@collation_connection, "
                "@txt, CAST(@dec AS CHAR), LAST_INSERT_ID(), (SELECT SUM(v) FROM py_tmp)")
    row = [str(v) for v in cur.fetchone()]
    cur.execute("SET @n = 21")
    cur.execute("EXECUTE twice USING @n")
    row.append(str(cur.fetchone()[0]))
    row.append(cipher)
    return row


print(json.dumps(state()), flush=True)
for line in sys.stdin:
    if line.strip() == "quit":
        break
    print(json.dumps(state()), flush=True)
cnx.close()
