"""Benchmark the transactional outbox.

1. Throughput: messages enqueued (one per committed transaction, from 4 producer threads)
   and delivered per second by 1 and by 4 relay processes (`python -m tenure relay`) to a
   local no-op webhook (an asyncio HTTP/1.1 server with keep-alive, in its own process),
   over http:// and over https:// (a self-signed certificate made with the `openssl` command,
   trusted by the relays through SSL_CERT_FILE).
   "delivered/s" counts from the first enqueue, so it is bounded by the producers; "drained/s"
   is the relays alone: the same number of messages committed in one transaction while the
   relays wait, timed from that commit to the last delivery.
2. The added cost of ``enqueue`` inside a fenced transaction: ``fence + INSERT`` against
   ``fence + INSERT + enqueue``, interleaved, one connection, latency per transaction.

    python bench/bench_outbox.py            # 3000 messages, 2000 transactions per variant
    python bench/bench_outbox.py --quick    # 300 messages, 200 transactions

DSN: --dsn, else $TENURE_DSN, else postgresql://postgres@127.0.0.1:5432/postgres. Works in a
fresh schema, dropped at the end. Figures depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import select
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

import tenure
from tenure import outbox

LOCAL = "postgresql://postgres@127.0.0.1:5432/postgres"
PRODUCERS = 4
TRUST: list[str] = []  # the https server's certificate, for the relays' SSL_CERT_FILE


def _noop_server(port_out: Any, cert: str | None = None) -> None:
    """A webhook that answers 200 to everything, as fast as asyncio allows (TLS with
    ``cert``, a PEM file holding the certificate and its key)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # HTTP/1.1 keep-alive: answer requests on one connection until the client closes it
        # or asks to ("Connection: close").
        while True:
            length, close = 0, False
            request = await reader.readline()
            if not request:
                break
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                elif name.strip().lower() == b"connection" and b"close" in value.lower():
                    close = True
            if length:
                await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
                + (b"Connection: close\r\n" if close else b"")
                + b"\r\n"
            )
            await writer.drain()
            if close:
                break
        writer.close()

    async def main() -> None:
        context = None
        if cert is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert)
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024, ssl=context)
        port_out.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _self_signed(folder: str) -> str:
    """A certificate for 127.0.0.1 and its key, in one PEM file."""
    pem = os.path.join(folder, "bench.pem")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", pem, "-out", pem + ".crt"),
        ],
        check=True,
        capture_output=True,
    )
    with open(pem, "a") as out, open(pem + ".crt") as crt:
        out.write(crt.read())
    return pem


def _start_relay(dsn: str, schema: str, url: str, concurrency: int) -> subprocess.Popen[str]:
    env = dict(os.environ, TENURE_DSN=dsn, TENURE_SCHEMA=schema)
    if url.startswith("https:"):
        env["SSL_CERT_FILE"] = TRUST[0]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tenure", "relay"),
            *("--webhook", f"bench={url}", "--concurrency", str(concurrency), "--poll", "1s"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    if not ready or "delivering" not in proc.stdout.readline():
        proc.kill()
        raise SystemExit("a relay did not start")
    return proc


def throughput(
    dsn: str, schema: str, url: str, relays: int, messages: int, concurrency: int
) -> tuple[float, float]:
    """(enqueued per second, delivered per second) with ``relays`` relay processes."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("TRUNCATE {}.outbox").format(sql.Identifier(schema)))
    procs = [_start_relay(dsn, schema, url, concurrency) for _ in range(relays)]
    try:
        per_producer = messages // PRODUCERS

        def produce(worker: int) -> None:
            with psycopg.connect(dsn) as conn:
                for i in range(per_producer):
                    with conn.transaction():
                        outbox.enqueue(
                            conn, "bench", f"{relays}-{worker}-{i}", {"i": i}, schema=schema
                        )

        start = time.perf_counter()
        threads = [threading.Thread(target=produce, args=(w,)) for w in range(PRODUCERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        enqueued = time.perf_counter() - start
        total = per_producer * PRODUCERS
        query = sql.SQL("SELECT count(*) FROM {}.outbox WHERE state = 'delivered'").format(
            sql.Identifier(schema)
        )
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                row = c.execute(query).fetchone()
                if row is not None and row[0] >= total:
                    break
                if time.perf_counter() - start > 600:
                    raise SystemExit("delivery did not finish within 10 minutes")
                time.sleep(0.02)
        delivered = time.perf_counter() - start
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
            if p.stdout is not None:
                p.stdout.close()
    return total / enqueued, total / delivered


def drain(dsn: str, schema: str, url: str, relays: int, messages: int, concurrency: int) -> float:
    """Deliveries per second of ``relays`` waiting relay processes, from the commit of
    ``messages`` messages (one transaction) to the last delivery."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("TRUNCATE {}.outbox").format(sql.Identifier(schema)))
    procs = [_start_relay(dsn, schema, url, concurrency) for _ in range(relays)]
    query = sql.SQL("SELECT count(*) FROM {}.outbox WHERE state = 'delivered'").format(
        sql.Identifier(schema)
    )
    try:
        with psycopg.connect(dsn) as conn:
            with conn.transaction():
                for i in range(messages):
                    outbox.enqueue(conn, "bench", f"drain-{relays}-{i}", {"i": i}, schema=schema)
            start = time.perf_counter()  # committed: the relays are notified now
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                row = c.execute(query).fetchone()
                if row is not None and row[0] >= messages:
                    break
                if time.perf_counter() - start > 600:
                    raise SystemExit("delivery did not finish within 10 minutes")
                time.sleep(0.02)
        return messages / (time.perf_counter() - start)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
            if p.stdout is not None:
                p.stdout.close()


def fenced_cost(dsn: str, schema: str, client: tenure.Client, txns: int) -> dict[str, list[float]]:
    """Latency (s) of fenced transactions without and with an enqueue, interleaved."""
    lease = client.acquire("bench-job", ttl=3600)
    assert lease is not None
    table = sql.Identifier(schema, "bench_work")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigint, note text)").format(table))
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table)
    out: dict[str, list[float]] = {"fence + insert": [], "fence + insert + enqueue": []}
    variants: list[tuple[str, Callable[[psycopg.Connection[Any], int], None]]] = [
        ("fence + insert", lambda conn, i: None),
        (
            "fence + insert + enqueue",
            lambda conn, i: outbox.enqueue(
                conn,
                "cost",
                f"job:{i}",
                {"i": i},
                schema=schema,
                job_key="bench-job",
                token=lease.token,
            ),
        ),
    ]
    with psycopg.connect(dsn) as conn:
        for i in range(txns + 20):
            for name, extra in variants if i % 2 else variants[::-1]:
                t0 = time.perf_counter()
                with conn.transaction():
                    tenure.fence(conn, "bench-job", lease.token, schema=schema)
                    conn.execute(insert, (i, "work"))
                    extra(conn, i)
                if i >= 20:  # warm-up excluded
                    out[name].append(time.perf_counter() - t0)
    lease.release()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TENURE_DSN", LOCAL))
    parser.add_argument("--quick", action="store_true", help="a small run (about a minute)")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--txns", type=int, default=None)
    parser.add_argument("--relay-concurrency", type=int, default=4)
    args = parser.parse_args()
    messages = args.messages or (300 if args.quick else 3000)
    txns = args.txns or (200 if args.quick else 2000)

    schema = f"bench_outbox_{uuid.uuid4().hex[:8]}"
    folder = tempfile.mkdtemp(prefix="bench_outbox_")
    TRUST.append(_self_signed(folder))
    urls: dict[str, str] = {}
    servers = []
    for scheme, cert in (("http", None), ("https", TRUST[0])):
        ports: Any = multiprocessing.Queue()
        server = multiprocessing.Process(target=_noop_server, args=(ports, cert), daemon=True)
        server.start()
        servers.append(server)
        urls[scheme] = f"{scheme}://127.0.0.1:{ports.get(timeout=30)}/hook"
    try:
        with tenure.connect(args.dsn, schema=schema, migrate=True) as client:
            print(f"tenure outbox benchmark: {client.where}, {os.cpu_count()} CPUs")
            print(
                f"\n1. {messages} messages, one per transaction from {PRODUCERS} producers, "
                f"to a no-op webhook (relay concurrency {args.relay_concurrency})"
            )
            print(
                f"   {'webhook':>7}  {'relays':>6}  {'enqueued/s':>10}  {'delivered/s':>11}"
                f"  {'drained/s':>9}"
            )
            for scheme, url in urls.items():
                for relays in (1, 4):
                    conc = args.relay_concurrency
                    enq, dlv = throughput(args.dsn, schema, url, relays, messages, conc)
                    drained = drain(args.dsn, schema, url, relays, messages, conc)
                    print(
                        f"   {scheme:>7}  {relays:>6}  {enq:>10.0f}  {dlv:>11.0f}  {drained:>9.0f}"
                    )

            print(f"\n2. fenced transaction latency, {txns} of each, interleaved, one connection")
            lat = fenced_cost(args.dsn, schema, client, txns)
            print(f"   {'variant':<26} {'median ms':>9} {'p95 ms':>8} {'mean ms':>8}")
            for name, xs in lat.items():
                p95 = statistics.quantiles(xs, n=20)[-1]
                print(
                    f"   {name:<26} {statistics.median(xs) * 1e3:>9.3f} {p95 * 1e3:>8.3f} "
                    f"{statistics.fmean(xs) * 1e3:>8.3f}"
                )
            base, with_enqueue = (statistics.median(xs) for xs in lat.values())
            print(
                f"   enqueue adds {(with_enqueue - base) * 1e3:.3f} ms per transaction "
                f"(median; {(with_enqueue / base - 1) * 100:+.0f} %)"
            )
    finally:
        for server in servers:
            server.terminate()
            server.join(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
        with psycopg.connect(args.dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
