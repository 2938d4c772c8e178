"""A mysql-connector-python connection pool across a pause of the serverless instance.

Arguments: host port user password database admin_host:port; the admin API's token in
the environment (HOLDFAST_ADMIN_TOKEN). Exit 77 when the driver is missing. The pool's five connections are opened and used, returned to the pool (idle),
then holdfast is asked to pause the instance (stop tier: the server process exits); the
same five pooled connections must work afterwards, with one resume for all of them.
"""
import json
import os
import sys
import urllib.request

host, port, user, password, database, admin = sys.argv[1:7]
try:
    import mysql.connector.pooling
except ImportError:
    print("mysql-connector-python is not installed")
    sys.exit(77)


def admin_json(path, method="GET"):
    req = urllib.request.Request(
        f"http://{admin}{path}", method=method,
        headers={"Authorization": "Bearer " + os.environ["HOLDFAST_ADMIN_TOKEN"]})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200, (path, resp.status)
        return json.load(resp)


pool = mysql.connector.pooling.MySQLConnectionPool(
    pool_name="holdfast", pool_size=5, host=host, port=int(port), user=user,
    password=password, database=database, use_pure=True)

conns = [pool.get_connection() for _ in range(5)]
ids_before = []
for c in conns:
    cur = c.cursor()
    cur.execute("SELECT CONNECTION_ID()")
    ids_before.append(cur.fetchone()[0])
    cur.close()
for c in conns:
    c.close()  # back to the pool, still connected

view = admin_json("/pause?tier=stop", method="POST")
assert view["phase"] == "paused", view
status = admin_json("/status")
assert len(status["sessions"]) == 5, status["sessions"]

conns = [pool.get_connection() for _ in range(5)]
for i, c in enumerate(conns):
    cur = c.cursor(prepared=True)
    cur.execute("SELECT ? + 1", (40 + i,))
    assert cur.fetchone()[0] == 41 + i
    cur.close()
for c in conns:
    c.close()

status = admin_json("/status")
assert status["serverless"]["phase"] == "running", status["serverless"]
assert status["serverless"]["resumes"] == 1, status["serverless"]
assert status["counters"]["connections_accepted"] == 5, status["counters"]
print("ok: 5 pooled connections kept across the pause, one resume")
