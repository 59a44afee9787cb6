//! The limit a pool shares with its siblings (the per-core pools of one
//! upstream): `max_connections` open connections, idle or busy, for all of
//! them; at the limit a request takes a sibling's idle connection or waits
//! in line for one to come back or close.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::{Connection, Pool, UpstreamError};

/// The connections of one upstream for a pool and all its siblings.
pub(super) struct Shared {
    /// One permit per open connection, idle or busy, whichever pool holds
    /// it: `max_connections` of them.
    slots: Arc<Semaphore>,
    /// Every sibling pool, so that at the limit a request can take one's
    /// idle connection instead of waiting.
    pools: Mutex<Vec<Weak<Pool>>>,
    /// Requests waiting at the limit, oldest first: a connection coming
    /// back to any pool is handed to the first still waiting, so they are
    /// served in the order they came, as a fair semaphore would.
    waiters: Mutex<VecDeque<oneshot::Sender<Handover>>>,
    /// How many `waiters` holds (some may have given up): a connection
    /// coming back looks at the queue only when it is not zero.
    waiting: AtomicUsize,
}

/// A connection handed to a waiting request, and the pool it goes back to.
type Handover = (Arc<Pool>, Connection);

/// What a wait at the limit ended with.
enum Waited {
    /// A connection another request gave back, and the pool it belongs to.
    Handed(Arc<Pool>, Connection),
    /// A connection closed: its slot, to dial another.
    Slot(OwnedSemaphorePermit),
    /// Neither, yet: look again (or the wait is over).
    Nothing,
}

/// A connection for one request, and the pool it goes back to.
pub(super) struct Acquired {
    pub(super) home: Arc<Pool>,
    pub(super) connection: Connection,
    /// It was idle in a pool: a request it hands back unsent may go out on
    /// another (a fresh connection that fails so early is an error).
    pub(super) pooled: bool,
}

impl Pool {
    /// This pool's most recently idle connection; else a new one while the
    /// limit allows; else a sibling's idle one; else the first to come back
    /// (or a new one for the slot of one that closed), within `wait`.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        waited_until: tokio::time::Instant,
        wait: Duration,
    ) -> Result<Acquired, UpstreamError> {
        let pooled = |home, connection| Ok(Acquired { home, connection, pooled: true });
        loop {
            if let Some(connection) = self.checkout() {
                return pooled(self.clone(), connection);
            }
            let slot = match self.shared.free_slot() {
                Some(slot) => slot,
                None => {
                    if let Some((home, connection)) = self.shared.take_idle() {
                        return pooled(home, connection);
                    }
                    match self.shared.wait(waited_until).await {
                        Waited::Handed(home, connection) => return pooled(home, connection),
                        Waited::Slot(slot) => slot,
                        Waited::Nothing if tokio::time::Instant::now() >= waited_until => {
                            return Err(UpstreamError::NoConnection(wait));
                        }
                        Waited::Nothing => continue,
                    }
                }
            };
            let connection = self.dial(slot, waited_until, wait).await?;
            return Ok(Acquired { home: self.clone(), connection, pooled: false });
        }
    }
}

impl Shared {
    pub(super) fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max_connections.clamp(1, Semaphore::MAX_PERMITS))),
            pools: Mutex::new(Vec::new()),
            waiters: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Registers a new pool among its siblings.
    pub(super) fn join(pool: Pool) -> Arc<Pool> {
        let pool = Arc::new(pool);
        let mut pools = pool.shared.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pools.retain(|sibling| sibling.strong_count() > 0);
        pools.push(Arc::downgrade(&pool));
        drop(pools);
        pool
    }

    /// An idle connection of any pool, with the pool it goes back to. Only
    /// at the limit: below it a pool dials its own, so that its connections
    /// are driven by its own runtime.
    fn take_idle(&self) -> Option<(Arc<Pool>, Connection)> {
        self.pools().into_iter().find_map(|pool| pool.checkout().map(|connection| (pool, connection)))
    }

    /// The sibling pools still in use (this one among them).
    fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect()
    }

    /// A slot for a new connection, if the limit allows one now.
    pub(super) fn free_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Hands one of `pool`'s idle connections to the oldest request still
    /// waiting, if there are both. A waiter queued before the first load
    /// here is seen by it; one queued after looks at the idle connections
    /// itself once queued.
    pub(super) fn hand_over(&self, pool: &Arc<Pool>) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        loop {
            let waiter = {
                let mut waiters = self.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let waiter = waiters.pop_front();
                self.waiting.store(waiters.len(), Ordering::SeqCst);
                waiter
            };
            let Some(waiter) = waiter else { return };
            let Some(connection) = pool.checkout() else {
                // Taken meanwhile: the waiter keeps its place.
                let mut waiters = self.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                waiters.push_front(waiter);
                self.waiting.store(waiters.len(), Ordering::SeqCst);
                return;
            };
            match waiter.send((pool.clone(), connection)) {
                Ok(()) => return,
                // That request stopped waiting: the next one may still be.
                Err((_, connection)) => pool.keep(connection),
            }
        }
    }

    /// Waits at the limit, in line behind the requests already waiting,
    /// until a connection is handed over or one closes (its slot), or until
    /// `waited_until`.
    async fn wait(&self, waited_until: tokio::time::Instant) -> Waited {
        let (handed, receive) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            waiters.retain(|waiter| !waiter.is_closed());
            waiters.push_back(handed);
            self.waiting.store(waiters.len(), Ordering::SeqCst);
        }
        // A connection kept idle just before this request joined the line
        // was handed to nobody: look once more now that it is in line.
        if let Some((home, connection)) = self.take_idle() {
            return Waited::Handed(home, connection);
        }
        tokio::select! {
            handed = receive => handed.map_or(Waited::Nothing, |(home, connection)| Waited::Handed(home, connection)),
            slot = self.slots.clone().acquire_owned() => slot.map_or(Waited::Nothing, Waited::Slot),
            () = tokio::time::sleep_until(waited_until) => Waited::Nothing,
        }
    }
}
