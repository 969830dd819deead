//! A minimal host for the account-pool component: `embed-rust POOL.wasm DATA_DIR` asks the
//! pool when it can serve a Claude thread, opens a route for it, adds an API-key account
//! through the `accounts` export, and asks again. Each import below says the contract it
//! keeps (`wit/` has them all); the reference host (`host/`) adds deadlines, memory caps, the
//! HTTP listener and outbound HTTP. WASI 0.2 comes from wasmtime-wasi and -http.

use rusqlite::types::{Value as Sql, ValueRef};
use wasmtime::component::{Component, HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Config, Engine, Result, Store, error::Context};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

wasmtime::component::bindgen!({
    path: "../../wit",
    // The pool's world without its HTTP handler export (this host serves no HTTP requests).
    world: "pooler:plugins/account-pool-core",
    imports: { "pooler:plugins/incoming-client.subscribe-gone": trappable },
    with: {
        "wasi": wasmtime_wasi::p2::bindings::sync,
        // A `connection` handle is an open rusqlite connection in the store's table.
        "pooler:plugins/sqlite.connection": rusqlite::Connection,
    },
});

use exports::pooler::plugins::accounts::{Credential, NewAccount};
use exports::pooler::plugins::availability::AvailabilityQuery;
use pooler::plugins::sqlite::{self, Error, Rows, Value};
use pooler::plugins::types::{AvailabilityChange, PluginError, Provider};
use pooler::plugins::{availability_listener, incoming_client, log, metrics};

/// One store's state. Every call gets a fresh store and instance: state lives only in the
/// pool's databases, and a host may drop an instance after any call.
struct State {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    no_network: NoNetwork,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// `wasi:http/outgoing-handler`, the pool's upstream calls: all refused here (no URL scheme
/// is supported); asking for availability and adding an API key make none.
struct NoNetwork;
impl WasiHttpHooks for NoNetwork {
    fn is_supported_scheme(&mut self, _: &http::uri::Scheme) -> bool {
        false
    }
}
impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        let (ctx, table, hooks) = (&mut self.http, &mut self.table, &mut self.no_network);
        WasiHttpCtxView { ctx, table, hooks }
    }
}

/// `log`: structured lines, here on standard error.
impl log::Host for State {
    fn log(&mut self, level: log::Level, message: String, fields: Vec<(String, String)>) {
        eprintln!("[pool {level:?}] {message} {fields:?}");
    }
}

/// `availability-listener`: the pool's availability changed. A host queues the signal and
/// delivers it to the listeners (Provider Retry) after the pool's call returned, never from
/// inside it; this host has no listener, so it prints it.
impl availability_listener::Host for State {
    fn availability_changed(&mut self, change: AvailabilityChange) -> Result<(), PluginError> {
        println!("availability-changed: {:?} {:?}", change.provider, change.causes);
        Ok(())
    }
}

/// `incoming-client`: whether the client of the HTTP request the pool is handling went away.
/// The pool asks only while it handles one, and this host hands it none.
impl incoming_client::Host for State {
    fn subscribe_gone(&mut self) -> Result<Resource<wasmtime_wasi::p2::DynPollable>> {
        wasmtime::bail!("this host serves no HTTP requests")
    }
    fn gone(&mut self) -> bool {
        false
    }
}

/// `metrics`: counters and histograms (name and label rules in `wit/metrics.wit`). A real
/// host keeps them and serves them (the reference host at `GET /metrics`); this one drops them.
impl metrics::Host for State {
    fn counter_add(&mut self, _name: String, _labels: Vec<(String, String)>, _delta: u64) {}
    fn observe(&mut self, _name: String, _labels: Vec<(String, String)>, _value: f64) {}
}

impl sqlite::Host for State {}
type Conn = Resource<rusqlite::Connection>;

/// `sqlite`: the pool's own databases; the name `x` is the file `x.sqlite3` in the data
/// directory (the working directory). A real host also refuses `ATTACH` of files and caps
/// open connections, as `wit/sqlite.wit` says.
impl sqlite::HostConnection for State {
    fn open(&mut self, name: String) -> Result<Conn, Error> {
        if name.is_empty() || name.len() > 64 || name.contains(['/', '\\', '.']) {
            return Err(Error::InvalidName(name));
        }
        let conn = rusqlite::Connection::open(format!("{name}.sqlite3")).map_err(db_error)?;
        // The contract: WAL mode, a 5 s busy timeout, foreign keys on.
        let setup = "PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000; PRAGMA foreign_keys=ON;";
        conn.execute_batch(setup).map_err(db_error)?;
        self.table.push(conn).map_err(io)
    }
    fn execute(&mut self, c: Conn, sql: String, params: Vec<Value>) -> Result<u64, Error> {
        let params = rusqlite::params_from_iter(params.into_iter().map(to_sql));
        Ok(self.table.get(&c).map_err(io)?.execute(&sql, params).map_err(db_error)? as u64)
    }
    fn execute_batch(&mut self, c: Conn, sql: String) -> Result<(), Error> {
        self.table.get(&c).map_err(io)?.execute_batch(&sql).map_err(db_error)
    }
    fn query(&mut self, c: Conn, sql: String, params: Vec<Value>) -> Result<Rows, Error> {
        let mut statement = self.table.get(&c).map_err(io)?.prepare(&sql).map_err(db_error)?;
        let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
        let params = rusqlite::params_from_iter(params.into_iter().map(to_sql));
        let rows = statement.query_map(params, |row| {
            (0..columns.len()).map(|i| row.get_ref(i).map(from_sql)).collect()
        });
        let rows = rows.and_then(Iterator::collect).map_err(db_error)?;
        Ok(Rows { columns, rows })
    }
    fn last_insert_rowid(&mut self, c: Conn) -> i64 {
        self.table.get(&c).map_or(0, |conn| conn.last_insert_rowid())
    }
    /// The guest let go of its handle: close the connection (an open transaction rolls back).
    fn drop(&mut self, c: Conn) -> Result<()> {
        Ok(self.table.delete(c).map(|_| ())?)
    }
}

fn to_sql(v: Value) -> Sql {
    match v {
        Value::Null => Sql::Null,
        Value::Integer(i) => Sql::Integer(i),
        Value::Real(f) => Sql::Real(f),
        Value::Text(s) => Sql::Text(s),
        Value::Blob(b) => Sql::Blob(b),
    }
}

fn from_sql(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn io(e: wasmtime::component::ResourceTableError) -> Error {
    Error::Io(e.to_string())
}

/// SQLite's errors as the contract's cases (`busy` is transient: the pool retries).
fn db_error(e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy) => Error::Busy,
        Some(rusqlite::ErrorCode::ConstraintViolation) => Error::Constraint(e.to_string()),
        _ => Error::InvalidStatement(e.to_string()),
    }
}

fn main() -> Result<()> {
    let args: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let [component, dir] = &args[..] else { wasmtime::bail!("usage: embed-rust POOL.wasm DIR") };
    let engine = Engine::new(Config::new().wasm_component_model(true))?;
    let component = Component::from_file(&engine, component).context("cannot load the pool")?;
    std::fs::create_dir_all(dir).and_then(|()| std::env::set_current_dir(dir))?;
    let mut linker = Linker::<State>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)?;
    sqlite::add_to_linker::<_, HasSelf<State>>(&mut linker, |s| s)?;
    log::add_to_linker::<_, HasSelf<State>>(&mut linker, |s| s)?;
    metrics::add_to_linker::<_, HasSelf<State>>(&mut linker, |s| s)?;
    availability_listener::add_to_linker::<_, HasSelf<State>>(&mut linker, |s| s)?;
    incoming_client::add_to_linker::<_, HasSelf<State>>(&mut linker, |s| s)?;
    let pre = AccountPoolCorePre::new(linker.instantiate_pre(&component)?)?;
    let fresh = || {
        let (wasi, http, table) =
            (WasiCtx::builder().build(), WasiHttpCtx::new(), Default::default());
        let mut store = Store::new(&engine, State { wasi, http, no_network: NoNetwork, table });
        let pool = pre.instantiate(&mut store)?;
        Result::<_>::Ok((store, pool))
    };

    let (thread, provider) = ("t1".to_owned(), Provider::Claude);
    let query = AvailabilityQuery { thread, provider, request: None, model: None };
    let ask = |when: &str| -> Result<()> {
        let (mut store, pool) = fresh()?;
        let answer = pool.pooler_plugins_availability().call_query(&mut store, &query)?;
        println!("availability ({when}): {answer:?}");
        Ok(())
    };
    ask("no route")?;
    // The pool serves only threads with a route (an agent would send its requests there).
    let (mut store, pool) = fresh()?;
    let (routing, url) = (pool.pooler_plugins_routing(), "http://127.0.0.1:8787");
    let opened = routing.call_open_route(&mut store, &query.thread, provider, url)?;
    opened.map_err(|e| wasmtime::format_err!("the pool refused the route: {e:?}"))?;
    ask("no accounts")?;
    let (credential, label) = (Credential::ApiKey("sk-ant-example-key".into()), Some("ex".into()));
    let account = NewAccount { provider, credential, label, priority: None, options: None };
    let (mut store, pool) = fresh()?;
    let added = pool.pooler_plugins_accounts().call_add(&mut store, &account)?;
    let info = added.map_err(|e| wasmtime::format_err!("the pool refused the account: {e:?}"))?;
    println!("added account {} ({}): {:?}", info.id, info.label, info.status);
    ask("one account")
}
