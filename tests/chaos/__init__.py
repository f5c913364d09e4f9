"""The long fault-injection run on a throwaway server this process starts, so that the
nemesis may also restart PostgreSQL (``tenure verify`` never restarts a server it did not
start). Everything else is :mod:`tenure.verify`; this is only the server and the flag::

    python -m tests.chaos --seconds 600 --workers 8 --keys 4
    python -m tests.chaos --seconds 10 --no-fence --expect-violations   # must find violations
"""
