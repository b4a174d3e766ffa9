"""Django's PostgreSQL backend, lending pooled connections checked without a query."""
