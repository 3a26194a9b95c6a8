DROP TABLE ssh_keys;
