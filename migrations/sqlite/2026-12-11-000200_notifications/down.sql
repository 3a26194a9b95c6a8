DROP TABLE notification_deliveries;
DROP TABLE notification_cursor;
DROP TABLE job_notify;
DROP TABLE notification_settings;
