"""``tenure exec``: one command under a fenced lease, once per slot across hosts."""
