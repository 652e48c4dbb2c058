//! Leader election on a coordination.k8s.io Lease, so that of several
//! operator replicas exactly one reconciles. The holder renews the Lease
//! well within its duration; a candidate takes it only once it has expired.
//! Every write carries the resourceVersion it read, so two candidates
//! cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api,
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    /// How often the holder renews: a third of the duration.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// Takes the Lease when it is free or expired, renews it when held:
    /// whether this candidate holds it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let expires = spec
            .renew_time
            .as_ref()
            .map(|t| t.0 + SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(seconds))));
        let free = spec.holder_identity.as_deref().is_none_or(str::is_empty) || expires.is_none_or(|at| at <= now);
        if !mine && !free {
            return Ok(false);
        }
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if mine { spec.acquire_time } else { Some(MicroTime(now)) },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        };
        let updated = Lease {
            spec: Some(spec),
            ..lease
        };
        conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &updated).await)
    }

    /// Gives the Lease up at shutdown, so a successor need not wait for it
    /// to expire.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        let released = Lease {
            spec: Some(spec),
            ..lease
        };
        conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &released).await).map(drop)
    }
}

/// A write that lost a race (409) means another candidate won.
fn conflict_is_false<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    //! kube-fake-client stands in for the kube-apiserver: resource versions
    //! and conflicts on stale writes, as the real one.
    use super::*;

    async fn pair(duration: Duration) -> (LeaderElector, LeaderElector) {
        let client = kube_fake_client::ClientBuilder::new().build().await.unwrap();
        let api: Api<Lease> = Api::namespaced(client, "sless-system");
        (
            LeaderElector::new(api.clone(), "sless-operator", "pod-a", duration),
            LeaderElector::new(api, "sless-operator", "pod-b", duration),
        )
    }

    #[tokio::test]
    async fn one_holder_at_a_time_and_a_takeover_only_after_expiry() {
        let (a, b) = pair(Duration::from_secs(1)).await;
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
        assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(b.try_acquire_or_renew().await.unwrap(), "an expired lease is free");
        assert!(!a.try_acquire_or_renew().await.unwrap(), "the old holder lost it");
        let lease = b.api.get("sless-operator").await.unwrap().spec.unwrap();
        assert_eq!(lease.holder_identity.as_deref(), Some("pod-b"));
        assert_eq!(lease.lease_transitions, Some(1));
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_at_once_and_a_stale_write_loses() {
        let (a, b) = pair(Duration::from_secs(60)).await;
        assert!(a.try_acquire_or_renew().await.unwrap());
        a.release().await.unwrap();
        assert!(b.try_acquire_or_renew().await.unwrap());
        // A write based on an old resourceVersion is a conflict, not a win.
        let mut stale = b.api.get("sless-operator").await.unwrap();
        assert!(b.try_acquire_or_renew().await.unwrap());
        stale.spec.as_mut().unwrap().holder_identity = Some("pod-a".into());
        let raced = b.api.replace("sless-operator", &PostParams::default(), &stale).await;
        assert!(!conflict_is_false(raced).unwrap());
    }
}
