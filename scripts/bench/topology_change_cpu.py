# CPU a holdfast process spends on topology changes while N TLS sessions idle (parked).
# Run by topology_change_cpu.sh; needs pymysql (python3-pymysql).
import pymysql, sys, time, json, subprocess, urllib.request, os
lab, port, admin, n, toggles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pid = int(sys.argv[6])
tok = open(f'{lab}/admin.token').read().strip()
def get(path):
    r = urllib.request.Request(f'http://127.0.0.1:{admin}{path}', headers={'Authorization': 'Bearer ' + tok})
    return urllib.request.urlopen(r).read().decode()
def metric(name):
    for l in get('/metrics').splitlines():
        if l.startswith(name + ' '):
            return float(l.split()[1])
    return None
def cpu():
    f = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')
def wait(what, cond, t=60):
    end = time.time() + t
    while time.time() < end:
        if cond(): return
        time.sleep(0.2)
    raise SystemExit(f'timed out: {what}')
def sql_running():
    st = json.loads(get('/status'))
    nodes = st.get('topology', st).get('nodes', [])
    return [nd.get('replication', {}).get('sql_running') for nd in nodes if nd.get('replication')]
ca = sys.argv[7] if len(sys.argv) > 7 else None
conns = []
for i in range(n):
    c = pymysql.connect(host='127.0.0.1', port=port, user='app', password='app_pass', database='sbtest',
                        autocommit=True, ssl={'ca': ca} if ca else None)
    c.cursor().execute('SELECT 1'); conns.append(c)
wait('parked', lambda: metric('holdfast_idle_sockets_parked') == 2 * n)
time.sleep(1)
c0 = cpu(); t0 = time.time()
for i in range(toggles):
    subprocess.run(['mariadb', '-S', f'{lab}/node2.sock', '-uroot', '-e', 'STOP SLAVE SQL_THREAD'], check=True)
    wait('stopped', lambda: sql_running() == [False])
    subprocess.run(['mariadb', '-S', f'{lab}/node2.sock', '-uroot', '-e', 'START SLAVE SQL_THREAD'], check=True)
    wait('started', lambda: sql_running() == [True])
wait('parked again', lambda: metric('holdfast_idle_sockets_parked') == 2 * n)
prev = -1
while True:
    time.sleep(0.5); cur = cpu()
    if cur == prev: break
    prev = cur
c1 = cpu(); secs = time.time() - t0
# The same time with nothing changing: the monitor's and the runtime's own.
i0 = cpu(); end = time.time() + secs
while time.time() < end:
    sql_running(); time.sleep(0.2)
idle = cpu() - i0
net = (c1 - c0) - idle
print(json.dumps({'idle_cpu_s': round(idle, 3), 'net_cpu_ms_per_change': round(net * 1000 / (2 * toggles), 2), 'net_us_per_session_per_change': round(net * 1e6 / (2 * toggles) / n, 2),'sessions': n, 'changes': 2 * toggles, 'cpu_s': round(c1 - c0, 3),
                  'cpu_ms_per_change': round((c1 - c0) * 1000 / (2 * toggles), 2),
                  'us_per_session_per_change': round((c1 - c0) * 1e6 / (2 * toggles) / n, 2),
                  'woken': metric('holdfast_idle_sockets_woken_total'), 'rung': metric('holdfast_idle_sessions_rung_total'),
                  'secs': round(time.time() - t0, 1)}))
for c in conns: c.close()
