"""Integrations with the frameworks applications already run: each submodule needs its own
optional extra (``pip install tenure[sqlalchemy]``, ``[django]``, ...) and is imported only
by whoever uses it, so ``import tenure`` never pulls a framework in.

* :mod:`tenure.contrib.sqlalchemy`: ``fence``/``outbox_enqueue`` joining a Session's
  transaction.
* :mod:`tenure.contrib.django`: a Django app (fence in ``atomic()``, ``manage.py
  tenure_worker``, system checks).
* :mod:`tenure.contrib.asgi`: run a :class:`tenure.Scheduler` in an ASGI app's lifespan.
"""
