"""Start-up time of `zodbd serve`: from the start of the process until it
sends its handshake on a new connection (the port is bound before the
storages are opened, so a bare connect proves nothing), for two binaries (before and after a change)
taking turns (the order alternating), on the same file.

    python bench/serve_startup.py ROUNDS BIN_A BIN_B FILE [-- SERVE ARGS]

Each server is started with `serve -r -a 127.0.0.1:PORT -f FILE` (read-only:
the file and its .index are not rewritten when it stops) and stopped with
SIGTERM once it has answered. Prints one line per start and the medians.
"""
import os
import signal
import socket
import statistics
import subprocess
import sys
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_time(binary, path, extra):
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([binary, "serve", "-r", "-a", f"127.0.0.1:{port}", "-f", path] + extra,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = t0 + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=120) as c:
                    if not c.recv(16):
                        raise SystemExit(f"{binary} closed the connection")
                    return time.perf_counter() - t0
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"{binary} exited with {proc.returncode}")
                if time.perf_counter() > deadline:
                    raise SystemExit(f"{binary} did not accept within 120 s")
                time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1:]
    rounds, a, b, path = int(args[0]), args[1], args[2], args[3]
    times = {"A": [], "B": []}
    for r in range(rounds):
        order = [("A", a), ("B", b)] if r % 2 == 0 else [("B", b), ("A", a)]
        for label, binary in order:
            t = start_time(binary, path, extra)
            times[label].append(t)
            print(f"round {r} {label} {t*1000:8.1f} ms", flush=True)
    ma, mb = statistics.median(times["A"]), statistics.median(times["B"])
    print(f"median A {ma*1000:.1f} ms [{min(times['A'])*1000:.1f}-{max(times['A'])*1000:.1f}], "
          f"B {mb*1000:.1f} ms [{min(times['B'])*1000:.1f}-{max(times['B'])*1000:.1f}], A/B {ma/mb:.2f}x")


if __name__ == "__main__":
    main()
