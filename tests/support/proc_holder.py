"""Executor processes driven by tests/test_processes.py: one JSON line per event on stdout.

Roles: pause (hold a lease, wait for "go" on stdin, then try a result write and a fenced
transaction), hold (hold a renewed lease until killed), renew-as-new-owner (a restarted
executor trying to renew its predecessor's lease), contend (compete for a key, with tiny
TTLs and renewals racing the expiry).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import sys
import time
import uuid

import psycopg

import tenure
from tenure.db.queries import compose
from tenure.leases.models import Grant


def emit(**fields: object) -> None:
    print(json.dumps(fields, default=str), flush=True)


def pause(client: tenure.Client, key: str, ttl: float) -> None:
    dsn = os.environ["TENURE_DSN"]
    with client.connection() as conn:
        conn.execute(
            compose("CREATE TABLE IF NOT EXISTS {schema}.ledger (note text)", client.schema)
        )
    with client.lease(key, ttl=ttl) as lease:
        emit(event="acquired", token=lease.token, owner=str(lease.owner))
        sys.stdin.readline()  # frozen here by SIGSTOP; resumed and told to go on
        outcome: dict[str, object] = {"event": "done"}
        try:
            client.results.put(key, {"by": "paused holder"}, token=lease.token)
            outcome["result"] = "written"
        except tenure.StaleTokenError as exc:
            outcome["result"] = "stale"
            outcome["current"] = exc.current_token
        with psycopg.connect(dsn) as conn:
            try:
                with conn.transaction():
                    conn.execute(
                        compose("INSERT INTO {schema}.ledger VALUES ('stale')", client.schema)
                    )
                    tenure.fence(conn, key, lease.token, schema=client.schema)
                outcome["fence"] = "committed"
            except tenure.StaleTokenError:
                outcome["fence"] = "stale"
        outcome["lost"] = lease.lost
        emit(**outcome)
        with contextlib.suppress(tenure.LeaseLost):
            lease.check()


def hold(client: tenure.Client, key: str, ttl: float) -> None:
    with client.lease(key, ttl=ttl) as lease:
        emit(event="acquired", token=lease.token, owner=str(lease.owner))
        while True:
            time.sleep(1)


def renew_as_new_owner(client: tenure.Client, key: str, old_token: int) -> None:
    info = client.inspect(key)
    assert info is not None
    owner = uuid.uuid4()
    impostor = tenure.Lease(
        client,
        key,
        owner,
        Grant(old_token, info.expires_at),
        ttl=5,
        safety_margin=0.5,
        sent_at=time.monotonic(),
    )
    try:
        impostor.renew()
        renew = "renewed"
    except tenure.LeaseLost:
        renew = "refused"
    waited = False
    while (lease := client.acquire(key, ttl=5)) is None:
        waited = True
        time.sleep(0.05)
    emit(renew=renew, owner=str(lease.owner), acquired_token=lease.token, waited_for_expiry=waited)


def contend(client: tenure.Client, key: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    busy = 0
    ttl = 0.15
    while time.monotonic() < end:
        lease = client.acquire(key, ttl=ttl)
        if lease is None:
            busy += 1
            time.sleep(random.uniform(0, 0.02))
            continue
        emit(
            kind="acquire",
            token=lease.token,
            owner=str(lease.owner),
            at=lease.acquired_at.isoformat() if lease.acquired_at else None,
            until=lease.expires_at.isoformat(),
        )
        for _ in range(random.randint(0, 3)):
            # Renew somewhere around the expiry: sometimes early, sometimes just too late.
            time.sleep(random.uniform(0.5, 1.2) * ttl)
            try:
                until = lease._client.fetch(
                    "renew",
                    {
                        "job_key": key,
                        "owner": lease.owner,
                        "token": lease.token,
                        "ttl": dt.timedelta(seconds=ttl),
                        "lock_timeout": "10s",
                    },
                    doing="renew",
                )
            except tenure.TenureError:
                break
            if not until:
                break
            emit(
                kind="renew",
                token=lease.token,
                owner=str(lease.owner),
                until=until[0][0].isoformat(),
            )
        if random.random() < 0.5:
            # Release early (as a finished job does); record when, by the database clock.
            released = client.fetch(
                "release",
                {
                    "job_key": key,
                    "owner": lease.owner,
                    "token": lease.token,
                    "channel": client.lease_channel,
                },
                doing="release",
            )
            if released:
                emit(
                    kind="release",
                    token=lease.token,
                    owner=str(lease.owner),
                    at=released[0][1].isoformat(),
                )
    emit(kind="summary", busy=busy)


def main() -> None:
    role, key, arg = sys.argv[1:4]
    with tenure.connect(schema=os.environ["TENURE_SCHEMA"]) as client:
        if role == "pause":
            pause(client, key, float(arg))
        elif role == "hold":
            hold(client, key, float(arg))
        elif role == "renew-as-new-owner":
            renew_as_new_owner(client, key, int(arg))
        elif role == "contend":
            contend(client, key, float(arg))
        else:
            raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
