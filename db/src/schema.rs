//! The one hand-written schema both backends share: ids as `BigInt`, enums as `Text`,
//! times as `Timestamp` in UTC, JSON as `Text`.

diesel::table! {
    labs (id) {
        id -> BigInt,
        slug -> Text,
        name -> Text,
        created_at -> Timestamp,
        quota -> Text,
        member_quota -> Text,
        checkpoint_cap_gb -> Nullable<Double>,
        interactive_boost -> Bool,
        require_signed_images -> Bool,
        files_quota_gb -> Nullable<Double>,
    }
}

diesel::table! {
    users (id) {
        id -> BigInt,
        username -> Text,
        email -> Text,
        display_name -> Text,
        is_operator -> Bool,
        created_at -> Timestamp,
        oidc_issuer -> Nullable<Text>,
        oidc_subject -> Nullable<Text>,
        operator_manual -> Bool,
    }
}

diesel::table! {
    memberships (user_id, lab_id) {
        user_id -> BigInt,
        lab_id -> BigInt,
        role -> Text,
        quota -> Text,
        source -> Text,
        files_quota_gb -> Nullable<Double>,
    }
}

diesel::table! {
    audit_log (id) {
        id -> BigInt,
        at -> Timestamp,
        actor_id -> Nullable<BigInt>,
        actor -> Text,
        lab_id -> Nullable<BigInt>,
        action -> Text,
        target -> Text,
        before -> Text,
        after -> Text,
    }
}

diesel::table! {
    api_tokens (id) {
        id -> BigInt,
        user_id -> BigInt,
        name -> Text,
        token_hash -> Text,
        created_at -> Timestamp,
        expires_at -> Nullable<Timestamp>,
        last_used_at -> Nullable<Timestamp>,
        revoked_at -> Nullable<Timestamp>,
        can_add_credentials -> Bool,
    }
}

diesel::table! {
    nodes (id) {
        id -> BigInt,
        lab_id -> BigInt,
        name -> Text,
        credential_hash -> Text,
        agent_version -> Text,
        online -> Bool,
        last_seen_at -> Nullable<Timestamp>,
        created_at -> Timestamp,
        revoked_at -> Nullable<Timestamp>,
        lending -> Text,
        grace_s -> Integer,
        reclaim -> Bool,
        agent_session -> BigInt,
        agent_seq -> BigInt,
        agent_seq_at -> Nullable<Timestamp>,
        draining -> Bool,
        cpus -> Double,
        memory_mb -> BigInt,
        disk_gb -> BigInt,
        max_job_disk_gb -> Nullable<BigInt>,
        disk_low -> Nullable<Text>,
        agent_addr -> Text,
        contender_session -> Nullable<BigInt>,
        contender_addr -> Nullable<Text>,
        contender_at -> Nullable<Timestamp>,
        shared_at -> Nullable<Timestamp>,
        shared_connected_from -> Nullable<Text>,
        shared_refused_from -> Nullable<Text>,
        gpu_baseline -> Nullable<Text>,
        inventory_unapproved -> Bool,
        datasets -> Text,
        share_mode -> Nullable<Text>,
    }
}

diesel::table! {
    enrol_tokens (id) {
        id -> BigInt,
        lab_id -> BigInt,
        token_hash -> Text,
        created_at -> Timestamp,
        expires_at -> Timestamp,
        used_at -> Nullable<Timestamp>,
        node_id -> Nullable<BigInt>,
    }
}

diesel::table! {
    gpus (id) {
        id -> BigInt,
        node_id -> BigInt,
        uuid -> Text,
        idx -> Integer,
        model -> Text,
        memory_mb -> BigInt,
        is_fake -> Bool,
        present -> Bool,
        local_use -> Bool,
        utilization_pct -> Integer,
        idle_since -> Nullable<Timestamp>,
        fault -> Nullable<Text>,
    }
}

diesel::table! {
    jobs (id) {
        id -> BigInt,
        user_id -> BigInt,
        lab_id -> BigInt,
        image -> Text,
        command -> Text,
        env -> Text,
        gpus -> Integer,
        gpu_models -> Text,
        min_gpu_memory_mb -> BigInt,
        cpus -> Double,
        memory_mb -> BigInt,
        time_limit_s -> BigInt,
        kind -> Text,
        state -> Text,
        reason -> Nullable<Text>,
        exit_code -> Nullable<BigInt>,
        attempts -> Integer,
        node_id -> Nullable<BigInt>,
        log_bytes -> BigInt,
        created_at -> Timestamp,
        started_at -> Nullable<Timestamp>,
        finished_at -> Nullable<Timestamp>,
        checkpoint_interval_s -> Nullable<BigInt>,
        shm_mb -> Nullable<BigInt>,
        image_digest -> Nullable<Text>,
        image_signature -> Nullable<Text>,
        image_campus -> Bool,
        disk_gb -> Nullable<BigInt>,
        name -> Nullable<Text>,
        tags -> Text,
        after_jobs -> Text,
        held -> Bool,
        inputs -> Text,
        datasets -> Text,
        array_id -> Nullable<BigInt>,
        array_index -> Nullable<BigInt>,
        gpu_milli -> Nullable<Integer>,
        gpu_share_memory_mb -> Nullable<BigInt>,
    }
}

diesel::table! {
    job_staging (job_id, attempt) {
        job_id -> BigInt,
        attempt -> Integer,
        done_bytes -> BigInt,
        total_bytes -> BigInt,
        finished -> Bool,
        started_at -> Timestamp,
        updated_at -> Timestamp,
    }
}

diesel::table! {
    job_attempts (id) {
        id -> BigInt,
        job_id -> BigInt,
        attempt -> Integer,
        node_id -> BigInt,
        gpu_ids -> Text,
        state -> Text,
        lease_until -> Timestamp,
        created_at -> Timestamp,
        started_at -> Nullable<Timestamp>,
        ended_at -> Nullable<Timestamp>,
        exit_code -> Nullable<BigInt>,
        reason -> Nullable<Text>,
        share_milli -> Nullable<Integer>,
        share_memory_mb -> Nullable<BigInt>,
        gpu_memory_used_mb -> Nullable<BigInt>,
    }
}

diesel::table! {
    job_events (id) {
        id -> BigInt,
        job_id -> BigInt,
        at -> Timestamp,
        state -> Text,
        message -> Text,
    }
}

diesel::table! {
    job_logs (id) {
        id -> BigInt,
        job_id -> BigInt,
        attempt -> Integer,
        chunk -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    checkpoints (id) {
        id -> BigInt,
        job_id -> BigInt,
        attempt -> Integer,
        seq -> Integer,
        node_id -> BigInt,
        lab_id -> BigInt,
        prefix -> Text,
        bytes -> BigInt,
        sha256 -> Text,
        parts -> Integer,
        created_at -> Timestamp,
        write_ms -> Nullable<BigInt>,
    }
}

diesel::table! {
    checkpoint_parts (id) {
        id -> BigInt,
        job_id -> BigInt,
        attempt -> Integer,
        seq -> Integer,
        n -> Integer,
        lab_id -> BigInt,
        bytes -> BigInt,
        sha256 -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    ssh_host_keys (algorithm) {
        algorithm -> Text,
        public_key -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    agent_mail (id) {
        id -> BigInt,
        node_id -> BigInt,
        body -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    ssh_keys (id) {
        id -> BigInt,
        user_id -> BigInt,
        name -> Text,
        algorithm -> Text,
        fingerprint -> Text,
        public_key -> Text,
        created_at -> Timestamp,
        last_used_at -> Nullable<Timestamp>,
    }
}

diesel::table! {
    cli_logins (id) {
        id -> BigInt,
        device_code_hash -> Text,
        user_code -> Text,
        client_name -> Text,
        created_at -> Timestamp,
        expires_at -> Timestamp,
        user_id -> Nullable<BigInt>,
        approved_at -> Nullable<Timestamp>,
        denied_at -> Nullable<Timestamp>,
        redeemed_at -> Nullable<Timestamp>,
        client_addr -> Text,
        interval_s -> BigInt,
        last_polled_at -> Nullable<Timestamp>,
        can_add_credentials -> Bool,
    }
}

diesel::table! {
    web_sessions (id_hash) {
        id_hash -> Text,
        user_id -> Nullable<BigInt>,
        state -> Text,
        created_at -> Timestamp,
        expires_at -> Timestamp,
    }
}

diesel::table! {
    image_allows (id) {
        id -> BigInt,
        lab_id -> Nullable<BigInt>,
        name_tag -> Text,
        digest -> Text,
        description -> Text,
        signature -> Nullable<Text>,
        signed_by -> Nullable<Text>,
        created_by -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    job_templates (id) {
        id -> BigInt,
        user_id -> BigInt,
        name -> Text,
        form -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    attempt_samples (id) {
        id -> BigInt,
        job_id -> BigInt,
        attempt -> Integer,
        at -> Timestamp,
        utilization_pct -> Double,
        memory_used_mb -> BigInt,
    }
}

diesel::table! {
    files (id) {
        id -> BigInt,
        space -> Text,
        path -> Text,
        object -> Text,
        bytes -> BigInt,
        sha256 -> Text,
        modified_at -> Timestamp,
    }
}

diesel::table! {
    file_uploads (id) {
        id -> BigInt,
        space -> Text,
        path -> Text,
        object -> Text,
        reserved -> BigInt,
        started_at -> Timestamp,
        touched_at -> Timestamp,
        resumable_by -> Nullable<BigInt>,
        size -> Nullable<BigInt>,
        sha256 -> Nullable<Text>,
    }
}

diesel::table! {
    file_upload_parts (upload_id, n) {
        upload_id -> BigInt,
        n -> Integer,
        bytes -> BigInt,
    }
}

diesel::table! {
    file_spaces (space) {
        space -> Text,
    }
}

diesel::joinable!(memberships -> users (user_id));
diesel::joinable!(job_templates -> users (user_id));
diesel::joinable!(memberships -> labs (lab_id));
diesel::joinable!(api_tokens -> users (user_id));
diesel::joinable!(ssh_keys -> users (user_id));
diesel::joinable!(nodes -> labs (lab_id));
diesel::joinable!(gpus -> nodes (node_id));
diesel::joinable!(jobs -> users (user_id));
diesel::joinable!(jobs -> labs (lab_id));
diesel::joinable!(job_attempts -> jobs (job_id));
diesel::joinable!(job_attempts -> nodes (node_id));
diesel::joinable!(job_events -> jobs (job_id));
diesel::table! {
    /// A waiting job's place in the queue and estimated start (unlogged in PostgreSQL).
    job_places (job_id) {
        job_id -> BigInt,
        queue_position -> Nullable<Integer>,
        estimated_start_at -> Nullable<Timestamp>,
    }
}

diesel::table! {
    job_apps (job_id) {
        job_id -> BigInt,
        port -> Integer,
        host -> Text,
        url -> Text,
        last_activity_at -> Nullable<Timestamp>,
        idle_minutes -> Nullable<Integer>,
        idle_warned_at -> Nullable<Timestamp>,
    }
}

diesel::table! {
    app_presets (id) {
        id -> BigInt,
        lab_id -> Nullable<BigInt>,
        name -> Text,
        title -> Text,
        description -> Text,
        colour -> Text,
        image -> Text,
        command -> Text,
        port -> Integer,
        gpus -> Integer,
        max_gpus -> Integer,
        hours -> Integer,
        max_hours -> Integer,
        cpus -> Double,
        max_cpus -> Double,
        memory_gb -> Double,
        max_memory_gb -> Double,
        user_sets -> Text,
        idle_minutes -> Integer,
        updated_by -> Text,
        updated_at -> Timestamp,
    }
}

diesel::table! {
    app_ready (job_id) {
        job_id -> BigInt,
        attempt -> Integer,
        at -> Timestamp,
    }
}

diesel::table! {
    app_grants (secret_sha256) {
        secret_sha256 -> Text,
        kind -> Text,
        job_id -> BigInt,
        user_id -> BigInt,
        expires_at -> Timestamp,
    }
}

diesel::joinable!(job_apps -> jobs (job_id));
diesel::joinable!(job_places -> jobs (job_id));
diesel::joinable!(app_ready -> jobs (job_id));
diesel::table! {
    datasets (id) {
        id -> BigInt,
        lab_id -> BigInt,
        name -> Text,
        source -> Text,
        description -> Text,
        visibility -> Text,
        created_by -> Text,
        created_at -> Timestamp,
    }
}

diesel::joinable!(app_presets -> labs (lab_id));
diesel::joinable!(datasets -> labs (lab_id));
diesel::joinable!(job_logs -> jobs (job_id));
diesel::joinable!(checkpoints -> jobs (job_id));
diesel::joinable!(checkpoint_parts -> jobs (job_id));
diesel::joinable!(attempt_samples -> jobs (job_id));
diesel::joinable!(job_staging -> jobs (job_id));

diesel::table! {
    arrays (id) {
        id -> BigInt,
        user_id -> BigInt,
        lab_id -> BigInt,
        spec -> Text,
        task_count -> BigInt,
        throttle -> Nullable<BigInt>,
        name -> Nullable<Text>,
        created_at -> Timestamp,
        first_job -> Nullable<BigInt>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    app_grants,
    app_ready,
    app_presets,
    datasets,
    job_apps,
    job_places,
    arrays,
    labs,
    users,
    memberships,
    api_tokens,
    nodes,
    enrol_tokens,
    gpus,
    jobs,
    job_attempts,
    job_events,
    job_staging,
    job_logs,
    audit_log,
    checkpoints,
    checkpoint_parts,
    ssh_host_keys,
    agent_mail,
    ssh_keys,
    cli_logins,
    web_sessions,
    image_allows,
    job_templates,
    attempt_samples,
    files,
    file_uploads,
    file_upload_parts,
    file_spaces,
);
