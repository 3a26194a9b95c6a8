ALTER TABLE labs DROP COLUMN interactive_boost;
