DROP TABLE cli_logins;
