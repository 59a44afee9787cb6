//! The lanes' pure core (`plan`, byte shares) and their wake-ups.

use super::*;

fn settings() -> Settings {
    Settings { batch_size: 128, max_in_flight: 64, max_batch_bytes: 8 << 20, ..Settings::default() }
}

fn room(places: usize, bytes: usize) -> Room {
    Room { places, unsettled: 128usize.saturating_sub(places), bytes, byte_share: 32 << 20 }
}

fn rows(plan: Plan) -> Option<u32> {
    match plan {
        Plan::Claim(limits) => Some(limits.rows),
        _ => None,
    }
}

#[test]
fn a_claim_takes_no_more_rows_than_free_places_or_a_batch() {
    assert_eq!(rows(plan(&settings(), room(128, 1 << 20))), Some(128));
    assert_eq!(rows(plan(&settings(), room(100, 1 << 20))), Some(100));
    let few = Settings { batch_size: 16, ..settings() };
    assert_eq!(rows(plan(&few, room(128, 1 << 20))), Some(16));
    assert_eq!(plan(&settings(), room(0, 1 << 20)), Plan::Wait, "every place taken");
}

#[test]
fn a_busy_lane_lingers_for_half_its_places_and_a_quiet_one_claims_at_once() {
    assert!(matches!(plan(&settings(), room(3, 1 << 20)), Plan::Linger(l) if l.rows == 3));
    assert_eq!(rows(plan(&settings(), room(64, 1 << 20))), Some(64));
    let quiet = Room { unsettled: 0, ..room(3, 1 << 20) };
    assert_eq!(rows(plan(&settings(), quiet)), Some(3), "nothing settling: nothing to wait for");
}

#[test]
fn a_claim_takes_no_more_bytes_than_are_free_and_goes_alone_only_with_the_whole_share() {
    let Plan::Claim(whole) = plan(&settings(), room(128, 32 << 20)) else { panic!("a claim") };
    assert_eq!((whole.bytes, whole.alone), (8 << 20, true), "capped by max_batch_bytes");
    let Plan::Claim(partly) = plan(&settings(), room(100, 1000)) else { panic!("a claim") };
    assert_eq!((partly.bytes, partly.alone), (1000, false), "a large row waits until the lane holds nothing");
    assert_eq!(plan(&settings(), room(100, 0)), Plan::Wait, "no byte free: wait for a publish to end");
}

fn lane(name: &str) -> Arc<Lane> {
    Arc::new(Lane::new(name, &settings(), 1))
}

/// Whether `lane` holds a wake-up (taking it).
async fn woken(lane: &Lane) -> bool {
    tokio::time::timeout(Duration::ZERO, lane.wake.notified()).await.is_ok()
}

#[tokio::test]
async fn a_notification_naming_a_destination_wakes_its_lane_and_any_other_wakes_them_all() {
    let (email, sms) = (lane("email"), lane("sms"));
    let wake = wake_for(vec![email.clone(), sms.clone()]);
    wake("sms");
    assert_eq!((woken(&email).await, woken(&sms).await), (false, true));
    for payload in ["", "fax"] {
        wake(payload);
        assert_eq!((woken(&email).await, woken(&sms).await), (true, true), "{payload:?}");
    }
}

#[test]
fn a_lane_holds_a_full_set_of_publishes_plus_one_claim_waiting_for_slots() {
    let lane = Lane::new("email", &settings(), 1 << 20);
    assert_eq!((lane.places, lane.slots.available_permits()), (64 + 128, 64));
    let tiny = Settings { batch_size: 0, max_in_flight: 0, ..settings() };
    assert_eq!(Lane::new("email", &tiny, 1).places, 2, "never a lane that cannot claim");
}

#[test]
fn the_byte_budget_is_shared_equally_and_never_zero() {
    assert_eq!(byte_share(32 << 20, 4), 8 << 20);
    assert_eq!(byte_share(32 << 20, 0), 32 << 20);
    assert_eq!(byte_share(0, 3), 1, "a zero budget still lets one row go at a time");
}
