DROP TABLE app_ready;
