//! Every public handle of the keeper can be shared between tasks, and every
//! public future can be spawned: checked at compile time.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use lease_core::Payload;
use lease_fake::Fake;
use lease_keeper::{
    AcquireError, Acquiring, Backoff, Campaign, Election, GroupLease, Keeper, Leader, Leadership,
    Lease, LeaseAbandoned, LeaseGroup, LeaseView, LossReason, LossWatch, Observer, ProclaimError,
    Resigner, TryAcquiring, WorkEnded,
};

use crate::common::key;

fn assert_send_sync<T: Send + Sync>() {}

fn assert_send<F: Send>(_: F) {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<Keeper>();
    assert_send_sync::<Lease>();
    assert_send_sync::<LeaseView>();
    assert_send_sync::<LeaseGroup>();
    assert_send_sync::<GroupLease>();
    assert_send_sync::<LossWatch>();
    assert_send_sync::<LossReason>();
    assert_send_sync::<Backoff>();
    assert_send_sync::<AcquireError>();
    assert_send_sync::<LeaseAbandoned>();
    assert_send_sync::<Acquiring<Keeper>>();
    assert_send_sync::<TryAcquiring<Keeper>>();
    assert_send_sync::<Acquiring<LeaseGroup>>();
    assert_send_sync::<TryAcquiring<LeaseGroup>>();
    assert_send_sync::<Election>();
    assert_send_sync::<Campaign>();
    assert_send_sync::<Leadership>();
    assert_send_sync::<Leader>();
    assert_send_sync::<Observer>();
    assert_send_sync::<Resigner>();
    assert_send_sync::<ProclaimError>();
    assert_send_sync::<WorkEnded<()>>();
}

#[tokio::test]
async fn futures_are_send() {
    let keeper = Keeper::new(Arc::new(Fake::new()));
    let k = key("send/one");
    assert_send(keeper.acquire(&k).into_future());
    assert_send(keeper.try_acquire(&k).into_future());
    let lease = keeper
        .try_acquire(&k)
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    assert_send(lease.lost());
    let mut watch = lease.loss_watch();
    assert_send(watch.wait());
    assert_send(lease.release());

    let group = keeper.group();
    let g = key("send/group");
    assert_send(group.acquire(&g).into_future());
    assert_send(group.try_acquire(&g).into_future());
    let member = group.try_acquire(&g).await.unwrap();
    assert_send(member.lost());
    assert_send(group.release(&member));
    assert_send(group.release_all());
    assert_send(group.abandoned());
    assert_send(group.scope(async {}));

    let election = keeper.election(&key("send/election"));
    assert_send(election.campaign(Payload::empty()).into_future());
    assert_send(election.leader());
    let mut observer = election.observe();
    assert_send(observer.changed());
    let leadership = election.campaign(Payload::empty()).await.unwrap();
    assert_send(leadership.proclaim(Payload::empty()));
    assert_send(leadership.run(async {}));
    assert_send(leadership.resign());
}
