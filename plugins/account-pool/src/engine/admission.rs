//! Admission: what a request comes to before it chooses an account. The head is
//! screened before the body is read ([`Engine::screen`]); then one read transaction reads
//! the route, the settings, the session and the state the first choice is made from.

use super::{Cancel, Clock, Ctx, Engine, IncomingRequest, Log, Random, Response, Upstream};
use crate::body::Refused;
use crate::http::{self, Endpoint, Headers, PoolError, RouteMatch};
use crate::model::Provider;
use crate::policy::AccountState;
use crate::session::{self, SessionInfo};
use crate::settings::Settings;
use crate::store::Store;
use crate::token;
use pooler_plugin_kit::{Db, DbError};

/// What a request's head comes to, before its body is read ([`Engine::screen`]).
pub enum Screen<B> {
    /// The pool answers it whatever its body holds (a method, path or route token it does
    /// not serve, or routing off): its body need not be kept.
    Refused(Response<B>),
    /// It may be routed: read its body, up to [`Admitted::max_body`] bytes, and serve it
    /// with [`Engine::with_admitted`].
    Admitted(Admitted),
    /// Storage cannot tell yet (not migrated, or failing): read the body and let
    /// [`Engine::handle`] decide (it migrates, or answers 503).
    Unknown,
}

/// A request's route and the settings it is served with, read before its body.
#[derive(Debug, Clone)]
pub struct Admitted {
    route: (String, Provider),
    settings: Settings,
}

impl Admitted {
    /// The most body bytes the request may have (`max-request-body`).
    pub fn max_body(&self) -> u64 {
        self.settings.max_request_body
    }
}

/// What a request comes to before it chooses an account, read in one read transaction.
enum Decision<B> {
    /// The pool answers it itself (bad method or path, bad token, routing off, too large).
    Refused(Response<B>),
    /// It is routed.
    Routed(Box<Routed>),
}

/// A request the pool routes: for the route's thread, with what it chooses from.
struct Routed {
    thread: String,
    settings: Settings,
    info: SessionInfo,
    snapshot: Snapshot,
}

/// The 413 message of a body within `max-request-body` that the instance's memory could
/// not hold.
pub const BODY_OUT_OF_MEMORY: &str = "The request body does not fit in the memory Account Pooler is given (it holds a body whole, to send it again on a retry). Send a smaller one, or raise the pool's memory limit in its host (`memory-mib` in the reference host) and keep `max-request-body` within it.";

/// Whether the pool serves this request, checked in the order the client should hear
/// about it: the endpoint and thread it is routed for, or the pool's own answer.
fn refusal<B>(
    req: &IncomingRequest,
    route: Option<(String, Provider)>,
    settings: &Settings,
) -> Result<(Endpoint, String), Response<B>> {
    let (endpoint, thread) = head_refusal(&req.method, &req.path, route, settings)?;
    let over = format!(
        "The request body exceeds {} bytes.",
        settings.max_request_body
    );
    let too_large = match req.body_refused {
        Some(Refused::OutOfMemory { .. }) => Some(BODY_OUT_OF_MEMORY.to_owned()),
        Some(Refused::OverLimit) => Some(over),
        None => (req.body.len() as u64 > settings.max_request_body).then_some(over),
    };
    if let Some(message) = too_large {
        return Err(Response::pool(
            endpoint.provider(),
            &PoolError::pool(413, message),
        ));
    }
    Ok((endpoint, thread))
}

/// The message of a 405: the method, and the path when the request named one (a
/// `CONNECT`'s target is no path).
pub fn not_allowed(method: &str, path: &str) -> String {
    if path.is_empty() {
        format!("{method} is not served by Account Pooler.")
    } else {
        format!("{method} is not allowed on {path}.")
    }
}

/// [`refusal`] from the request's head alone: everything but the body's size.
fn head_refusal<B>(
    method: &str,
    path: &str,
    route: Option<(String, Provider)>,
    settings: &Settings,
) -> Result<(Endpoint, String), Response<B>> {
    let endpoint = match http::match_route(method, path) {
        RouteMatch::Endpoint(e) => e,
        RouteMatch::MethodNotAllowed(p) => {
            return Err(Response::pool(
                p,
                &PoolError::pool(405, not_allowed(method, path)),
            ));
        }
        RouteMatch::NotFound(guess) => {
            let p = route
                .as_ref()
                .map(|r| r.1)
                .or(guess)
                .unwrap_or(Provider::Claude);
            let status = if route.is_some() { 404 } else { 401 };
            let msg = if route.is_some() {
                format!("Account Pooler does not serve {path}.")
            } else {
                "Invalid Account Pooler bearer token.".to_owned()
            };
            return Err(Response::pool(p, &PoolError::pool(status, msg)));
        }
    };
    let provider = endpoint.provider();
    let Some((thread, _)) = route.filter(|r| r.1 == provider) else {
        return Err(Response::pool(
            provider,
            &PoolError::pool(401, "Invalid Account Pooler bearer token."),
        ));
    };
    if !settings.routing(provider) {
        return Err(Response::pool(
            provider,
            &PoolError::pool(
                503,
                format!("Account Pooler routing is off for {provider}."),
            ),
        ));
    }
    Ok((endpoint, thread))
}

/// The state a routed request chooses its first account from.
pub(super) struct Snapshot {
    pub(super) provider: Provider,
    /// The provider's accounts, in selection order.
    pub(super) accounts: Vec<AccountState>,
    /// The session's fresh pin.
    pub(super) pin: Option<crate::store::Pin>,
    /// The account of the parent session's fresh pin, when the session has no pin.
    pub(super) inherited: Option<String>,
    /// The provider's round-robin cursor.
    pub(super) cursor: Option<String>,
}

impl Snapshot {
    /// Read the request's session (its body is parsed only now, for a request the pool
    /// routes) and the state it chooses from.
    fn read<D: Db>(
        st: &Store<'_, D>,
        endpoint: Endpoint,
        req: &IncomingRequest,
        s: &Settings,
        now: u64,
    ) -> Result<(SessionInfo, Snapshot), DbError> {
        let provider = endpoint.provider();
        let found = session::extract(provider, &req.headers, &req.body);
        let info = if endpoint.is_conversation() {
            found
        } else {
            SessionInfo {
                family: found.family,
                ..SessionInfo::default()
            }
        };
        let pin = match info.key.as_deref() {
            Some(k) => st.pin(provider, k, now, s.pin_lifetime_ms)?,
            None => None,
        };
        let inherited = match (info.key.as_deref(), info.parent.as_deref(), &pin) {
            (Some(_), Some(parent), None) => st
                .pin(provider, parent, now, s.pin_lifetime_ms)?
                .map(|p| p.account),
            _ => None,
        };
        let snapshot = Snapshot {
            provider,
            accounts: st.accounts(Some(provider))?,
            pin,
            inherited,
            cursor: st.cursor(provider)?,
        };
        Ok((info, snapshot))
    }
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Engine<'a, D, U, E>
{
    /// Look at a request's head before its body is read: its settings and route token,
    /// in one read transaction. A request the pool would refuse whatever its body holds is
    /// answered now, so a caller need not keep a body (up to `max-request-body` of it) only
    /// to refuse it.
    pub fn screen(&self, method: &str, path: &str, headers: &Headers) -> Screen<U::Body> {
        let hash = token::from_headers(headers).map(|t| token::hash(&t));
        let read = self.store.read(|st| {
            if !st.schema_current()? {
                return Ok(None);
            }
            let route = match &hash {
                Some(h) => st.route_by_hash(h)?,
                None => None,
            };
            Ok(Some((route, st.settings()?)))
        });
        let Ok(Some((route, settings))) = read else {
            return Screen::Unknown;
        };
        match head_refusal(method, path, route.clone(), &settings) {
            Err(refused) => Screen::Refused(refused),
            Ok(_) => match route {
                Some(route) => Screen::Admitted(Admitted { route, settings }),
                None => Screen::Unknown,
            },
        }
    }

    pub(super) async fn handle_inner(
        &self,
        req: &IncomingRequest,
    ) -> Result<Response<U::Body>, DbError> {
        let start = self.env.now();
        // Everything the request decides on that the screen did not read, in one read
        // transaction: one snapshot, one read lock (instead of one per statement).
        let read = |st: &Store<'a, D>| -> Result<Option<Decision<U::Body>>, DbError> {
            let (route, settings) = match &self.admitted {
                // Screened: the schema was current then, and a schema never goes back.
                Some(a) => (Some(a.route.clone()), a.settings.clone()),
                None => {
                    if !st.schema_current()? {
                        return Ok(None);
                    }
                    let route = match token::from_headers(&req.headers) {
                        Some(t) => st.route_by_hash(&token::hash(&t))?,
                        None => None,
                    };
                    (route, st.settings()?)
                }
            };
            Ok(Some(match refusal(req, route, &settings) {
                Err(refused) => Decision::Refused(refused),
                Ok((endpoint, thread)) => {
                    let (info, snapshot) = Snapshot::read(st, endpoint, req, &settings, start)?;
                    Decision::Routed(Box::new(Routed {
                        thread,
                        settings,
                        info,
                        snapshot,
                    }))
                }
            }))
        };
        let decision = match self.store.read(read)? {
            Some(d) => d,
            None => {
                self.store.migrate()?;
                self.store
                    .read(read)?
                    .ok_or_else(|| DbError::Decode("the schema did not migrate".into()))?
            }
        };
        let Routed {
            thread,
            settings,
            info,
            snapshot,
        } = match decision {
            Decision::Refused(response) => {
                self.report.borrow_mut().outcome = Some("refused");
                return Ok(response);
            }
            Decision::Routed(routed) => *routed,
        };
        {
            let mut report = self.report.borrow_mut();
            report.provider = Some(snapshot.provider);
            report.thread = Some(thread.clone());
            report.session = info.key.as_deref().map(super::report::session_hash);
        }
        let ctx = Ctx {
            provider: snapshot.provider,
            req,
            family: info.family,
            key: info.key.as_deref(),
            settings: &settings,
        };
        self.route(&ctx, &thread, snapshot).await
    }
}
