#!/usr/bin/python3
"""kvx_test.py: multi-process tests of the KV data plane (common/kvx/) on loopback.

Usage: kvx_test.py KVX_PEER_EXE SCENARIO...   (UCX_TLS chosen by the caller: tcp, or sm transports)

Each scenario starts kvx_peer processes, passes their blobs through the driver (standing in for the
control plane) and checks what they report. Every child is killed when the driver exits, whatever
happens (and kvx_peer also dies with its parent through PR_SET_PDEATHSIG).
"""
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

TIMEOUT = float(os.environ.get("KVX_TEST_TIMEOUT", "60"))
PEER_EXE = None
ALL = []


class Peer:
    def __init__(self, name, *args):
        self.name = name
        self.proc = subprocess.Popen([PEER_EXE] + list(args), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        ALL.append(self)
        self.q = queue.Queue()
        self.backlog = []
        threading.Thread(target=self._reader, daemon=True).start()
        self.blob = self.expect("BLOB").split()[1]

    def _reader(self):
        for line in self.proc.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix, timeout=TIMEOUT):
        """Next line starting with `prefix` (earlier non-matching lines are kept for later)."""
        for i, line in enumerate(self.backlog):
            if line.startswith(prefix):
                return self.backlog.pop(i)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("%s: no '%s' within %.0f s (backlog %s)" %
                                     (self.name, prefix, timeout, self.backlog[-5:]))
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError("%s exited (rc %s) while waiting for '%s'" %
                                     (self.name, self.proc.poll(), prefix))
            if line.startswith(prefix):
                return line
            self.backlog.append(line)

    def cmd(self, line, reply, timeout=TIMEOUT):
        self.send(line)
        return self.expect(reply, timeout)

    def connect(self, other, as_name=None):
        r = self.cmd("CONNECT %s %s" % (as_name or other.name, other.blob), ("CONNECTED", "ERR"))
        return r

    def quit(self):
        self.cmd("QUIT", "BYE")
        rc = self.proc.wait(timeout=TIMEOUT)
        check(rc == 0, "%s exited with %d (leak or error)" % (self.name, rc))

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def cpu_s(peer):
    """User + system CPU seconds used so far by a peer process."""
    with open("/proc/%d/stat" % peer.proc.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def ids(lst):
    return ",".join(str(i) for i in lst)


def push(src_peer, dst_name, tag, seed, src, dst, flags=0):
    src_peer.send("PUSH %s %s %d %d %s %s" % (tag, dst_name, seed, flags, ids(src), ids(dst)))


def done(peer, tag, timeout=TIMEOUT):
    """(status, ms, rest) of a transfer; a transfer refused at once (REJECT) reads as status."""
    f = peer.expect(("DONE %s " % tag, "REJECT %s " % tag), timeout).split()
    if f[0] == "REJECT":
        return f[2], 0.0, []
    return f[2], float(f[3]), f[4:] if len(f) > 4 else []


def random_sets(rng, n_blocks):
    """Contiguous runs, scattered sets and the whole pool, as (src, dst) id lists."""
    whole = list(range(n_blocks))
    perm = whole[:]
    rng.shuffle(perm)
    out = [(whole, whole), (whole, perm), ([3], [n_blocks - 1])]
    for _ in range(4):
        k = rng.randint(1, n_blocks)
        a = rng.randint(0, n_blocks - k)
        b = rng.randint(0, n_blocks - k)
        out.append((list(range(a, a + k)), list(range(b, b + k))))  # one run
        s = rng.sample(whole, k)
        d = rng.sample(whole, k)
        out.append((s, d))  # scattered
    return out


def expect_recv_ok(peer, n):
    r = peer.expect("RECV").split()
    check(r[1] == "OK" and int(r[2]) == n and r[3] == "1",
          "%s: bad completion %s (want OK %d verified)" % (peer.name, r, n))


# ---- scenarios ----------------------------------------------------------------------------------

def sc_basic(args):
    """Pushes and pulls of random block sets, verified byte for byte when the completion arrives."""
    rng = random.Random(1)
    for blocks, bb in ((64, 65536), (512, 4096)):
        a = Peer("a", "--blocks", str(blocks), "--block-bytes", str(bb), *args)
        b = Peer("b", "--blocks", str(blocks), "--block-bytes", str(bb), *args)
        check(a.connect(b).startswith("CONNECTED"), "connect failed")
        a.cmd("FILL 1", "FILLED")
        push(a, "b", "w", 1, [0], [0])
        expect_recv_ok(b, 1)
        done(a, "w")
        print("mechanism a->b: %s" % {"1": "am", "2": "put"}.get(a.cmd("MECH b", "MECH").split()[2]))
        seed = 100
        for i, (src, dst) in enumerate(random_sets(rng, blocks)):
            seed += 1
            a.cmd("FILL %d" % seed, "FILLED")
            push(a, "b", "p%d" % i, seed, src, dst, flags=i % 2)
            expect_recv_ok(b, len(src))
            st, ms, _ = done(a, "p%d" % i)
            check(st == "OK", "push %d: %s" % (i, st))
        # three pushes in flight at once to disjoint destinations
        seed += 1
        a.cmd("FILL %d" % seed, "FILLED")
        third = blocks // 3
        for j in range(3):
            src = rng.sample(range(blocks), third)
            push(a, "b", "c%d" % j, seed, src, list(range(j * third, (j + 1) * third)), flags=1)
        for j in range(3):
            expect_recv_ok(b, third)
        for j in range(3):
            check(done(a, "c%d" % j)[0] == "OK", "concurrent push failed")
        # pulls: a takes b's blocks; verified by a when its completion runs
        for i, (src, dst) in enumerate(random_sets(rng, blocks)[:6]):
            seed += 1
            b.cmd("FILL %d" % seed, "FILLED")
            a.send("PULL q%d b %d %d %s %s" % (i, seed, i % 2, ids(src), ids(dst)))
            st, ms, rest = done(a, "q%d" % i)
            check(st == "OK" and rest == ["1"], "pull %d: %s %s" % (i, st, rest))
        # b pushes back to a over the endpoint a's HELLO made it open (symmetric peers)
        b.send("CONNECT a " + a.blob)
        b.expect("CONNECTED")
        seed += 1
        b.cmd("FILL %d" % seed, "FILLED")
        push(b, "a", "r", seed, list(range(blocks)), list(range(blocks)))
        expect_recv_ok(a, blocks)
        check(done(b, "r")[0] == "OK", "reverse push failed")
        # bad input is an error, not a crash
        a.send("PUSH bad b 1 0 0,%d 0,1" % blocks)
        check("TD_ERANGE" in a.expect("REJECT bad"), "out-of-range block accepted")
        # idle: the loop sleeps on the event fd; UCX's keepalive timer wakes it now and then,
        # which must cost next to no CPU (busy polling would burn a whole core)
        w0 = int(a.cmd("STATS", "STATS").split("wakeups=")[1])
        c0 = cpu_s(a) + cpu_s(b)
        time.sleep(1.0)
        c1 = cpu_s(a) + cpu_s(b)
        w1 = int(a.cmd("STATS", "STATS").split("wakeups=")[1])
        print("idle for 1 s: %d wakeups, %.3f s CPU for both processes" % (w1 - w0, c1 - c0))
        check(c1 - c0 < 0.25, "busy polling: %.2f s CPU in 1 s idle" % (c1 - c0))
        a.quit()
        b.quit()


def sc_multi(args):
    """Several senders push into one receiver at once; the receiver pushes back meanwhile."""
    rng = random.Random(2)
    blocks = 192  # senders use [0, 96) as sources and r's [0, 96) as targets; the push back [96, 192)
    r = Peer("r", "--blocks", str(blocks), *args)
    senders = [Peer("s%d" % i, "--blocks", str(blocks), *args) for i in range(3)]
    for s in senders:
        check(s.connect(r).startswith("CONNECTED"), "connect")
    check(r.connect(senders[0]).startswith("CONNECTED"), "connect back")
    for rnd in range(4):
        seeds = [1000 + rnd * 10 + i for i in range(3)]
        for s, seed in zip(senders, seeds):
            s.cmd("FILL %d" % seed, "FILLED")
        r.cmd("FILL %d" % (2000 + rnd), "FILLED")
        for i, (s, seed) in enumerate(zip(senders, seeds)):
            src = rng.sample(range(96), 32)
            push(s, "r", "m%d" % rnd, seed, src, list(range(i * 32, i * 32 + 32)), flags=rnd % 2)
        back = list(range(96, 192))
        push(r, "s0", "back%d" % rnd, 2000 + rnd, back, back)
        for _ in range(3):
            expect_recv_ok(r, 32)
        expect_recv_ok(senders[0], 96)
        for s in senders:
            check(done(s, "m%d" % rnd)[0] == "OK", "multi push")
        check(done(r, "back%d" % rnd)[0] == "OK", "push back")
    for p in senders + [r]:
        p.quit()


def sc_mismatch(args):
    """Pools with different fingerprints or block sizes refuse each other."""
    a = Peer("a", "--fp", "model-A", *args)
    b = Peer("b", "--fp", "model-B", *args)
    c = Peer("c", "--block-bytes", "131072", "--fp", "model-A", *args)
    check("TD_EMISMATCH" in a.connect(b), "fingerprint mismatch accepted")
    check("TD_EMISMATCH" in a.connect(c), "block size mismatch accepted")
    check("TD_EPARSE" in a.cmd("CONNECT z 00ff", ("CONNECTED", "ERR")), "garbage blob accepted")
    for p in (a, b, c):
        p.quit()


def sc_csum(args):
    """A block whose checksum does not match is an error at both ends, never data."""
    a = Peer("a", *args)
    b = Peer("b", *args)
    a.connect(b)
    a.cmd("FILL 7", "FILLED")
    push(a, "b", "good", 7, [1, 2, 3], [4, 5, 6], flags=1)
    expect_recv_ok(b, 3)
    check(done(a, "good")[0] == "OK", "good push")
    push(a, "b", "bad", 7, [1, 2, 3], [4, 5, 6], flags=3)
    rb = b.expect("RECV").split()
    check(rb[1] == "TD_ECHECKSUM", "receiver accepted a corrupted block: %s" % rb)
    check(done(a, "bad")[0] == "TD_ECHECKSUM", "sender not told of the corruption")
    a.quit()
    b.quit()


def sc_kill(args):
    """SIGKILL a receiver (then a sender) mid-transfer: pending operations fail within a bounded
    time, the survivor keeps serving others, and a restarted peer is reachable again."""
    big = ["--blocks", "64", "--block-bytes", str(1 << 20)]
    a = Peer("a", *big, *args)
    b = Peer("b", *big, *args)
    c = Peer("c", *big, *args)
    a.connect(b)
    a.connect(c)
    a.cmd("FILL 11", "FILLED")
    whole = list(range(64))
    n = 24
    for i in range(n):
        push(a, "b", "k%d" % i, 11, whole, whole)
    b.expect("RECV")  # the first transfer landed: the rest are in flight or queued
    b.kill()
    t_kill = time.monotonic()
    failed = 0
    last = 0.0
    for i in range(n):
        st, ms, _ = done(a, "k%d" % i, timeout=20)
        if st != "OK":
            failed += 1
            last = time.monotonic() - t_kill
    print("killed receiver: %d of %d pushes failed, last error %.3f s after SIGKILL" %
          (failed, n, last))
    check(failed > 0, "no push failed although the receiver died")
    check(last < 5.0, "errors took %.1f s" % last)
    # the survivor serves another peer
    push(a, "c", "c1", 11, whole, whole, flags=1)
    expect_recv_ok(c, 64)
    check(done(a, "c1")[0] == "OK", "survivor cannot serve c")
    # the dead peer: the next use fails cleanly instead of hanging
    t0 = time.monotonic()
    push(a, "b", "dead", 11, [0], [0])
    st, _, _ = done(a, "dead", timeout=30)
    print("push to the dead peer: %s after %.2f s" % (st, time.monotonic() - t0))
    check(st != "OK", "push to a dead peer succeeded")
    # a restarted peer (new blob from the control plane) is reachable again
    b2 = Peer("b2", *big, *args)
    check(a.connect(b2, as_name="b").startswith("CONNECTED"), "reconnect")
    push(a, "b", "again", 11, whole[:8], whole[8:16], flags=1)
    expect_recv_ok(b2, 8)
    check(done(a, "again")[0] == "OK", "restarted peer not reachable")

    # now kill a sender in the middle of its pushes: the receiver survives and serves others
    c.connect(b2)
    c.cmd("FILL 12", "FILLED")
    for i in range(n):
        push(c, "b2", "s%d" % i, 12, whole, whole)
    b2.expect("RECV")
    c.kill()
    time.sleep(1.5)
    b2.cmd("FILL 13", "FILLED")
    b2.connect(a)
    push(b2, "a", "after", 13, whole[:4], whole[:4])
    expect_recv_ok(a, 4)
    check(done(b2, "after")[0] == "OK", "receiver unusable after its sender died")
    a.quit()
    b2.quit()


SCENARIOS = {"basic": sc_basic, "multi": sc_multi, "mismatch": sc_mismatch, "csum": sc_csum,
             "kill": sc_kill}


def main():
    global PEER_EXE
    PEER_EXE = sys.argv[1]
    names = sys.argv[2:] or list(SCENARIOS)
    extra = os.environ.get("KVX_PEER_ARGS", "").split()
    print("UCX_TLS=%s" % os.environ.get("UCX_TLS", "(default)"))
    rc = 0
    try:
        for name in names:
            t0 = time.monotonic()
            SCENARIOS[name](extra)
            print("ok %s (%.1f s)" % (name, time.monotonic() - t0))
            sys.stdout.flush()
    except AssertionError as e:
        print("FAIL: %s" % e)
        rc = 1
    finally:
        for p in ALL:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())
