"""The widths of the integer columns (``models``): ids and run numbers are ``Integer`` (int32 on PostgreSQL),
steps and lengths ``BigInteger`` (int64). What the API and the ingest bound integers by (``api.bounds``)."""

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
