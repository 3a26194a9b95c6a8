DROP TABLE checkpoint_parts;
