DROP TABLE agent_mail;
DROP TABLE ssh_host_keys;
