-- PostgreSQL's pages keep room for a row's next version (fillfactor); SQLite has no such
-- setting. Kept so both backends list the same migrations.
SELECT 1;
