"""Long-form jobs: one long text split at sentence boundaries into segments that
run in parallel on the GPU pool, then joined in order into one file.

The long job is a parent `Job`; each segment is a child `Job` (`parent_id`,
`segment_index`) that goes through the ordinary queue machinery. Segments are
internal: not listed, not charged, no usage of their own.
"""
