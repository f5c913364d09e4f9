"""Storage: where the database is (DSN, embedded server), the named SQL statements and the
migrations that create tenure's tables, and the timeouts every connection carries."""
