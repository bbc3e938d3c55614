-- sandboxd store, schema version 14 (issue 28, item 5): hibernated sessions. A running
-- session whose /workspace was saved to a snapshot file and whose sandbox was removed names
-- that file in `snapshot` (NULL while its sandbox lives); `template` is the template it was
-- made from (NULL: the default image), so it resumes from the same image.
ALTER TABLE sessions ADD COLUMN template TEXT;
ALTER TABLE sessions ADD COLUMN snapshot TEXT;
