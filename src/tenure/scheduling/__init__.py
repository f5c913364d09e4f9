"""The scheduler's internals: slot maths (:mod:`.schedules`), the worker (:mod:`.worker`),
operator actions (:mod:`.ops`) and the ``tenure worker`` / ``tenure jobs`` commands
(:mod:`.commands`). The public API is :mod:`tenure.scheduler`."""
