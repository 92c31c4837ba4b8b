BEGIN TRANSACTION;
CREATE TABLE alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO "alembic_version" VALUES('v3.2.0.a');
CREATE TABLE studies (
	study_id INTEGER NOT NULL, 
	study_name VARCHAR(512) NOT NULL, 
	PRIMARY KEY (study_id)
);
INSERT INTO "studies" VALUES(1,'s1/matmul');
CREATE TABLE study_directions (
	study_direction_id INTEGER NOT NULL, 
	direction VARCHAR(8) NOT NULL, 
	study_id INTEGER NOT NULL, 
	objective INTEGER NOT NULL, 
	PRIMARY KEY (study_direction_id), 
	UNIQUE (study_id, objective), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
INSERT INTO "study_directions" VALUES(1,'MINIMIZE',1,0);
CREATE TABLE study_system_attributes (
	study_system_attribute_id INTEGER NOT NULL, 
	study_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (study_system_attribute_id), 
	UNIQUE (study_id, "key"), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
CREATE TABLE study_user_attributes (
	study_user_attribute_id INTEGER NOT NULL, 
	study_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (study_user_attribute_id), 
	UNIQUE (study_id, "key"), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
CREATE TABLE trial_heartbeats (
	trial_heartbeat_id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	heartbeat DATETIME NOT NULL, 
	PRIMARY KEY (trial_heartbeat_id), 
	UNIQUE (trial_id), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_intermediate_values (
	trial_intermediate_value_id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	intermediate_value FLOAT, 
	intermediate_value_type VARCHAR(7) NOT NULL, 
	PRIMARY KEY (trial_intermediate_value_id), 
	UNIQUE (trial_id, step), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_params (
	param_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	param_name VARCHAR(512), 
	param_value FLOAT, 
	distribution_json TEXT, 
	PRIMARY KEY (param_id), 
	UNIQUE (trial_id, param_name), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
INSERT INTO "trial_params" VALUES(1,1,'BLOCK',58.0,'{"name": "IntDistribution", "attributes": {"log": false, "step": 1, "low": 16, "high": 64}}');
INSERT INTO "trial_params" VALUES(2,2,'BLOCK',47.0,'{"name": "IntDistribution", "attributes": {"log": false, "step": 1, "low": 16, "high": 64}}');
INSERT INTO "trial_params" VALUES(3,3,'BLOCK',43.0,'{"name": "IntDistribution", "attributes": {"log": false, "step": 1, "low": 16, "high": 64}}');
CREATE TABLE trial_system_attributes (
	trial_system_attribute_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (trial_system_attribute_id), 
	UNIQUE (trial_id, "key"), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_user_attributes (
	trial_user_attribute_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	"key" VARCHAR(512), 
	value_json TEXT, 
	PRIMARY KEY (trial_user_attribute_id), 
	UNIQUE (trial_id, "key"), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
CREATE TABLE trial_values (
	trial_value_id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	objective INTEGER NOT NULL, 
	value FLOAT, 
	value_type VARCHAR(7) NOT NULL, 
	PRIMARY KEY (trial_value_id), 
	UNIQUE (trial_id, objective), 
	FOREIGN KEY(trial_id) REFERENCES trials (trial_id)
);
INSERT INTO "trial_values" VALUES(1,1,0,58.0,'FINITE');
INSERT INTO "trial_values" VALUES(2,2,0,47.0,'FINITE');
INSERT INTO "trial_values" VALUES(3,3,0,43.0,'FINITE');
CREATE TABLE trials (
	trial_id INTEGER NOT NULL, 
	number INTEGER, 
	study_id INTEGER, 
	state VARCHAR(8) NOT NULL, 
	datetime_start DATETIME, 
	datetime_complete DATETIME, 
	PRIMARY KEY (trial_id), 
	FOREIGN KEY(study_id) REFERENCES studies (study_id)
);
INSERT INTO "trials" VALUES(1,0,1,'COMPLETE','2026-11-30 12:14:48.576976','2026-11-30 12:14:48.966207');
INSERT INTO "trials" VALUES(2,1,1,'COMPLETE','2026-11-30 12:14:49.079682','2026-11-30 12:14:49.187983');
INSERT INTO "trials" VALUES(3,2,1,'COMPLETE','2026-11-30 12:14:49.227428','2026-11-30 12:14:49.303217');
CREATE TABLE tuner_cache_claims (
	key_hash VARCHAR(64) NOT NULL, 
	owner VARCHAR(200) NOT NULL, 
	expires_at FLOAT NOT NULL, 
	PRIMARY KEY (key_hash)
);
INSERT INTO "tuner_cache_claims" VALUES('ffffffffffffffffffffffffffffffff','oldhost:4242:abcd:1',1.7960410069614157676e+09);
CREATE TABLE tuner_cache_entries (
	key_hash VARCHAR(64) NOT NULL, 
	kernel VARCHAR(200) NOT NULL, 
	source_hash VARCHAR(64) NOT NULL, 
	key_fields JSON NOT NULL, 
	dtypes JSON NOT NULL, 
	device VARCHAR(200) NOT NULL, 
	versions JSON NOT NULL, 
	config JSON NOT NULL, 
	time_s FLOAT NOT NULL, 
	spread_s FLOAT NOT NULL, 
	date VARCHAR(40) NOT NULL, 
	space VARCHAR(200) NOT NULL, 
	PRIMARY KEY (key_hash)
);
INSERT INTO "tuner_cache_entries" VALUES('538d165b07c271417e0c0d957c004bd5','matmul','0123abcd','{"M": 64, "N": 64}','["float32"]','cpu','{"triton": "3.7.1"}','{"BLOCK": 16}',0.0064,1.0e-06,'2026-11-01T00:00:00Z','fp123');
INSERT INTO "tuner_cache_entries" VALUES('2b0f9f79f5c03d0f69f66b3be2d88089','matmul','0123abcd','{"M": 128, "N": 64}','["float32"]','cpu','{"triton": "3.7.1"}','{"BLOCK": 32}',0.0128,1.0e-06,'2026-11-01T00:00:00Z','fp123');
INSERT INTO "tuner_cache_entries" VALUES('0f08acef14281ecd99f8d7fc000826c6','matmul','0123abcd','{"M": 256, "N": 64}','["float32"]','cpu','{"triton": "3.7.1"}','{"BLOCK": 64}',0.0256,1.0e-06,'2026-11-01T00:00:00Z','fp123');
CREATE TABLE tuner_measurements (
	id INTEGER NOT NULL, 
	task_id VARCHAR(40) NOT NULL, 
	kernel VARCHAR(200) NOT NULL, 
	space_fingerprint VARCHAR(40) NOT NULL, 
	problem JSON NOT NULL, 
	dtype VARCHAR(40) NOT NULL, 
	device VARCHAR(200) NOT NULL, 
	versions JSON NOT NULL, 
	config JSON NOT NULL, 
	config_key TEXT NOT NULL, 
	value FLOAT, 
	status VARCHAR(40) NOT NULL, 
	stats JSON NOT NULL, 
	error TEXT, 
	study_name VARCHAR(300), 
	trial_number INTEGER, 
	strategy VARCHAR(60), 
	worker VARCHAR(200), 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "tuner_measurements" VALUES(1,'cfa76cf48c5e9686dea4','matmul','fp123','{"M": 64, "N": 64}','','cpu','{"triton": "3.7.1"}','{"BLOCK": 16}','{"BLOCK":16}',0.001,'ok','{"duration_s": 0.5}',NULL,'s1',0,'random','w1','2026-11-30 12:14:46.873270');
INSERT INTO "tuner_measurements" VALUES(2,'8d184566d8d2aa43084e','matmul','fp123','{"M": 128, "N": 64}','','cpu','{"triton": "3.7.1"}','{"BLOCK": 32}','{"BLOCK":32}',0.002,'ok','{"duration_s": 0.5}',NULL,'s1',1,'random','w1','2026-11-30 12:14:46.883679');
INSERT INTO "tuner_measurements" VALUES(3,'3a3406af90293464b5e4','matmul','fp123','{"M": 192, "N": 64}','','cpu','{"triton": "3.7.1"}','{"BLOCK": 48}','{"BLOCK":48}',0.003,'ok','{"duration_s": 0.5}',NULL,'s1',2,'random','w1','2026-11-30 12:14:46.884981');
INSERT INTO "tuner_measurements" VALUES(4,'cfa76cf48c5e9686dea4','matmul','fp123','{"M": 64, "N": 64}','','cpu','{"triton": "3.7.1"}','{"BLOCK": 64}','{"BLOCK":64}',0.004,'ok','{"duration_s": 0.5}',NULL,NULL,3,'random','w1','2026-11-30 12:14:46.898811');
INSERT INTO "tuner_measurements" VALUES(5,'8d184566d8d2aa43084e','matmul','fp123','{"M": 128, "N": 64}','','cpu','{"triton": "3.7.1"}','{"BLOCK": 80}','{"BLOCK":80}',NULL,'compile_error','{"duration_s": 0.5}','too much shared memory',NULL,4,'random','w1','2026-11-30 12:14:46.900227');
INSERT INTO "tuner_measurements" VALUES(6,'3a3406af90293464b5e4','matmul','fp123','{"M": 192, "N": 64}','','cpu','{"triton": "3.7.1"}','{"BLOCK": 96}','{"BLOCK":96}',0.006,'ok','{"duration_s": 0.5}',NULL,NULL,5,'random','w1','2026-11-30 12:14:46.909982');
CREATE TABLE tuner_meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "tuner_meta" VALUES('schema_version','1');
CREATE TABLE tuner_study_tasks (
	id INTEGER NOT NULL, 
	study VARCHAR(100) NOT NULL, 
	"key" VARCHAR(500) NOT NULL, 
	seq INTEGER NOT NULL, 
	spec JSON NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	worker VARCHAR(200), 
	lease_token VARCHAR(40), 
	lease_expires_at FLOAT, 
	heartbeat_at FLOAT, 
	attempts INTEGER NOT NULL, 
	trials_done INTEGER NOT NULL, 
	best_value FLOAT, 
	best_config JSON, 
	spent_s FLOAT NOT NULL, 
	started_at FLOAT, 
	finished_at FLOAT, 
	error TEXT, 
	result JSON, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_tuner_study_task UNIQUE (study, "key")
);
INSERT INTO "tuner_study_tasks" VALUES(1,'s1','matmul/M64',0,'{"study": "s1", "key": "matmul/M64", "kernel": "matmul", "problem": {"M": 64, "dtype": "float32"}, "backend": "triton", "device": "cpu", "budget": 4, "time_budget_s": null, "strategy": "random", "seed": 0, "finalists": null, "seq": 0}','done','w1',NULL,NULL,1.7960408870379970074e+09,1,4,0.5,'{"BLOCK": 16}',0.0,1.7960408870379970074e+09,1.796040887069016695e+09,NULL,'{"best_value": 0.5}');
INSERT INTO "tuner_study_tasks" VALUES(2,'s1','matmul/M128',1,'{"study": "s1", "key": "matmul/M128", "kernel": "matmul", "problem": {"M": 128, "dtype": "float32"}, "backend": "triton", "device": "cpu", "budget": 4, "time_budget_s": null, "strategy": "random", "seed": 0, "finalists": null, "seq": 1}','pending',NULL,NULL,NULL,NULL,0,0,NULL,NULL,0.0,NULL,NULL,NULL,NULL);
CREATE TABLE version_info (
	version_info_id INTEGER NOT NULL, 
	schema_version INTEGER, 
	library_version VARCHAR(256), 
	PRIMARY KEY (version_info_id), 
	CHECK (version_info_id=1)
);
INSERT INTO "version_info" VALUES(1,12,'5.0.0');
CREATE INDEX ix_tuner_measurements_space_fingerprint ON tuner_measurements (space_fingerprint);
CREATE INDEX ix_tuner_measurements_kernel ON tuner_measurements (kernel);
CREATE INDEX ix_tuner_measurements_study_name ON tuner_measurements (study_name);
CREATE INDEX ix_tuner_measurements_task_id ON tuner_measurements (task_id);
CREATE INDEX ix_tuner_measurements_device ON tuner_measurements (device);
CREATE INDEX ix_tuner_cache_entries_kernel ON tuner_cache_entries (kernel);
CREATE INDEX ix_tuner_study_tasks_study ON tuner_study_tasks (study);
CREATE UNIQUE INDEX ix_studies_study_name ON studies (study_name);
CREATE INDEX ix_trials_study_id ON trials (study_id);
COMMIT;
