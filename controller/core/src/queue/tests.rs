//! Unit tests of the queue's bookkeeping.

use super::*;

fn key(name: &str) -> ObjectRef<AppService> {
    ObjectRef::new(name).within("ns")
}

fn encode(queue: &Queue) -> String {
    let mut registry = Registry::default();
    queue.register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

#[test]
fn the_next_reconcile_is_data_and_becomes_the_same_action() {
    for delay in [
        Duration::ZERO,
        Duration::from_millis(1500),
        Duration::from_secs(600),
    ] {
        assert_eq!(Next::requeue(delay).delay(), Some(delay));
        assert_eq!(Next::requeue(delay).action(), Action::requeue(delay));
    }
    assert_eq!(Next::await_change().delay(), None);
    assert_eq!(Next::await_change().action(), Action::await_change());
}

#[test]
fn a_trigger_waits_once_until_its_reconcile_starts() {
    let queue = Arc::new(Queue::default());
    let t0 = Instant::now();
    queue.triggered(&key("a"), t0);
    queue.triggered(&key("a"), t0 + Duration::from_millis(10));
    queue.triggered(&key("b"), t0 + Duration::from_millis(20));
    assert_eq!(
        queue.adds(),
        2,
        "a second trigger of a waiting object adds nothing"
    );
    queue.refresh(t0 + Duration::from_millis(30));
    assert_eq!(queue.depth.get(), 2);

    let running = queue.start(key("a"), t0 + Duration::from_millis(500), true);
    queue.refresh(t0 + Duration::from_millis(1500));
    assert_eq!(queue.depth.get(), 1);
    assert_eq!(queue.active_workers.get(), 1);
    assert!((queue.longest_running.get() - 1.0).abs() < 1e-9);
    assert!((queue.unfinished_work.get() - 1.0).abs() < 1e-9);

    // Triggered while running: waits, but is not in the queue until the end.
    queue.triggered(&key("a"), t0 + Duration::from_millis(1600));
    queue.refresh(t0 + Duration::from_millis(1700));
    assert_eq!(queue.depth.get(), 1);
    running.finish(
        &Ok(Next::await_change()),
        t0 + Duration::from_secs(2),
        Duration::from_secs(600),
    );
    queue.refresh(t0 + Duration::from_secs(2));
    assert_eq!(queue.depth.get(), 2);
    assert_eq!(queue.active_workers.get(), 0);
    assert_eq!(queue.longest_running.get(), 0.0);
    assert_eq!(queue.reconciles(ReconcileResult::Success), 1);

    let text = encode(&queue);
    // The first wait of "a" was 500 ms.
    assert!(
        text.contains("workqueue_queue_duration_seconds_bucket{le=\"0.5\",name=\"appservice\"} 1")
            || text.contains(
                "workqueue_queue_duration_seconds_bucket{name=\"appservice\",le=\"0.5\"} 1"
            ),
        "{text}"
    );
}

#[test]
fn requeues_wait_from_when_they_are_due() {
    let queue = Arc::new(Queue::default());
    let resync = Duration::from_secs(600);
    let t0 = Instant::now();
    queue.triggered(&key("a"), t0);
    let running = queue.start(key("a"), t0, true);
    running.finish(&Ok(Next::requeue(Duration::from_secs(10))), t0, resync);
    assert_eq!(queue.reconciles(ReconcileResult::Requeue), 1);
    assert_eq!(queue.adds(), 2);
    queue.refresh(t0 + Duration::from_secs(5));
    assert_eq!(queue.depth.get(), 0, "not due yet");
    queue.refresh(t0 + Duration::from_secs(11));
    assert_eq!(queue.depth.get(), 1);
    // A watch event before the requeue is due takes its place, once.
    queue.triggered(&key("a"), t0 + Duration::from_secs(1));
    assert_eq!(queue.adds(), 3);
    queue.triggered(&key("a"), t0 + Duration::from_secs(2));
    assert_eq!(queue.adds(), 3);

    // A converged object's resync is a success, and is scheduled.
    let running = queue.start(key("a"), t0 + Duration::from_secs(3), true);
    running.finish(
        &Ok(Next::requeue(resync)),
        t0 + Duration::from_secs(3),
        resync,
    );
    assert_eq!(queue.reconciles(ReconcileResult::Success), 1);
    assert_eq!(queue.tracked(), 1);
    queue.forget(&key("a"));
    assert_eq!(queue.tracked(), 0);
}

#[test]
fn errors_and_retries_are_counted() {
    let queue = Arc::new(Queue::default());
    let t0 = Instant::now();
    queue.triggered(&key("a"), t0);
    let running = queue.start(key("a"), t0, true);
    running.finish(
        &Err(Error::NotLeader),
        t0 + Duration::from_millis(3),
        Duration::from_secs(600),
    );
    queue.retried(&key("a"), Next::requeue(Duration::from_secs(2)), t0);
    queue.retried(&key("b"), Next::await_change(), t0);
    assert_eq!(queue.reconciles(ReconcileResult::Error), 1);
    assert_eq!(queue.retries(), 1);
    assert_eq!(queue.reconcile_errors.get(), 1);
    assert_eq!(queue.tracked(), 1, "only the retried object is scheduled");
}

#[test]
fn a_cancelled_reconcile_leaves_the_running_set() {
    let queue = Arc::new(Queue::default());
    let t0 = Instant::now();
    let running = queue.start(key("a"), t0, true);
    drop(running);
    queue.refresh(t0 + Duration::from_secs(1));
    assert_eq!(queue.active_workers.get(), 0);
    assert_eq!(queue.longest_running.get(), 0.0);
    assert_eq!(queue.tracked(), 0);
    // A standby's pass is not work, and leaves nothing behind.
    queue.triggered(&key("b"), t0);
    drop(queue.start(key("b"), t0, false));
    assert_eq!(queue.tracked(), 0);
    assert_eq!(queue.active_workers.get(), 0);
}

#[test]
fn every_series_exists_from_the_start() {
    let queue = Queue::default();
    queue.set_max_concurrent(16);
    queue.refresh(Instant::now());
    let text = encode(&queue);
    for line in [
        "workqueue_depth{name=\"appservice\"} 0",
        "workqueue_adds_total{name=\"appservice\"} 0",
        "workqueue_retries_total{name=\"appservice\"} 0",
        "workqueue_queue_duration_seconds_count{name=\"appservice\"} 0",
        "workqueue_work_duration_seconds_count{name=\"appservice\"} 0",
        "workqueue_unfinished_work_seconds{name=\"appservice\"} 0",
        "workqueue_longest_running_processor_seconds{name=\"appservice\"} 0",
        "controller_runtime_reconcile_total{controller=\"appservice\",result=\"success\"} 0",
        "controller_runtime_reconcile_total{controller=\"appservice\",result=\"requeue\"} 0",
        "controller_runtime_reconcile_total{controller=\"appservice\",result=\"error\"} 0",
        "controller_runtime_reconcile_errors_total{controller=\"appservice\"} 0",
        "controller_runtime_active_workers{controller=\"appservice\"} 0",
        "controller_runtime_max_concurrent_reconciles{controller=\"appservice\"} 16",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}
