//! Agents given several servers (issue 17.4): a list of servers, or a name
//! resolving to several addresses, each holding its own stream, with no load
//! balancer in front; the server count still decides how many streams.
//! Three servers share one port on 127.0.0.1, 127.0.0.2 and 127.0.0.3, as HA
//! servers behind one DNS name do.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::certs::Pki;
use integration_tests::client::grpc_dial;
use integration_tests::konnectivity::{
    AgentOpts, RunningAgent, RunningServer, SERVERS_NAME, ServerOpts, init_logging, start_agent,
    start_server,
};
use proxy_agent::servers::{Resolver, Servers};

const HOSTS: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
const PATIENCE: Duration = Duration::from_secs(30);

/// A port free on all three addresses.
fn shared_port() -> u16 {
    for _ in 0..20 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(port) = first.local_addr().map(|a| a.port()) else {
            continue;
        };
        if HOSTS[1..]
            .iter()
            .all(|h| std::net::TcpListener::bind((*h, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no port free on {HOSTS:?}");
}

async fn server_on(pki: &Pki, host: &'static str, port: u16, count: u32) -> RunningServer {
    start_server(
        pki,
        ServerOpts {
            agent_host: host,
            agent_port: port,
            server_id: format!("server-{host}"),
            server_count: count,
            ..Default::default()
        },
    )
    .await
}

async fn three_servers(pki: &Pki, count: u32) -> (u16, Vec<RunningServer>) {
    let port = shared_port();
    let mut servers = Vec::new();
    for h in HOSTS {
        servers.push(server_on(pki, h, port, count).await);
    }
    (port, servers)
}

/// An agent given the three servers as a list.
async fn listed_agent(pki: &Pki, port: u16) -> RunningAgent {
    let servers = Servers {
        hosts: HOSTS.iter().map(|h| (h.to_string(), port)).collect(),
        ..Default::default()
    };
    let first = SocketAddr::from(([127, 0, 0, 1], port));
    start_agent(
        pki,
        first,
        AgentOpts {
            servers,
            ..Default::default()
        },
    )
    .await
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within {PATIENCE:?}"),
    }
}

async fn agent_count_is(agent: &RunningAgent, n: usize) {
    let mut rx = agent.handle.watch_connected();
    within(
        &format!("the agent holds {n} streams"),
        rx.wait_for(|c| *c == n),
    )
    .await
    .ok();
}

/// A tunnel through `server`'s frontend reaches the echo destination (so
/// the agent's stream to that server carries data).
async fn tunnel_works(server: &RunningServer, echo: SocketAddr) {
    let mut t = within("dial", grpc_dial(&server.frontend, &echo.to_string()))
        .await
        .unwrap_or_else(|e| panic!("dial through {}: {e:?}", server.agent_addr));
    t.write(b"ping").await;
    assert_eq!(within("echo", t.read_exact(4)).await, b"ping");
    t.finish().await;
}

#[tokio::test]
async fn an_agent_given_a_list_holds_a_stream_to_each_server() {
    init_logging();
    let pki = Pki::new();
    let (port, mut servers) = three_servers(&pki, 3).await;
    let echo = integration_tests::dest::echo().await;
    let agent = listed_agent(&pki, port).await;
    agent_count_is(&agent, 3).await;
    for s in &servers {
        within("the server sees the agent", s.handle.wait_for_agents(1)).await;
        tunnel_works(s, echo).await;
    }

    // One server goes away: the agent keeps the other two, and is back on
    // the third as soon as it returns.
    let gone = servers.remove(1);
    gone.stop().await;
    agent_count_is(&agent, 2).await;
    let back = server_on(&pki, HOSTS[1], port, 3).await;
    within(
        "the returned server sees the agent",
        back.handle.wait_for_agents(1),
    )
    .await;
    agent_count_is(&agent, 3).await;
    tunnel_works(&back, echo).await;
}

#[tokio::test]
async fn the_server_count_decides_how_many_of_the_listed_servers() {
    init_logging();
    let pki = Pki::new();
    let (port, mut servers) = three_servers(&pki, 2).await;
    let agent = listed_agent(&pki, port).await;
    agent_count_is(&agent, 2).await;
    let held: Vec<usize> = (0..3)
        .filter(|i| servers[*i].handle.agent_streams() == 1)
        .collect();
    assert_eq!(held.len(), 2, "servers holding the agent: {held:?}");
    let idle = (0..3).find(|i| !held.contains(i)).unwrap_or_default();
    // A held server goes away: the count (2) is made up from the third.
    let gone = servers.remove(held[0]);
    gone.stop().await;
    let idle = if held[0] < idle { idle - 1 } else { idle };
    within(
        "the third server gets the agent",
        servers[idle].handle.wait_for_agents(1),
    )
    .await;
    agent_count_is(&agent, 2).await;
}

#[tokio::test]
async fn an_agent_given_a_name_holds_a_stream_to_each_address_it_resolves_to() {
    init_logging();
    let pki = Pki::new();
    let (port, servers) = three_servers(&pki, 3).await;
    let echo = integration_tests::dest::echo().await;
    // The name resolves to two of the three addresses at first.
    let answer = Arc::new(std::sync::Mutex::new(vec![
        SocketAddr::from(([127, 0, 0, 1], port)),
        SocketAddr::from(([127, 0, 0, 2], port)),
    ]));
    let seen = answer.clone();
    let resolver: Resolver = Arc::new(move |host, _| {
        let addrs = seen.lock().map(|a| a.clone()).unwrap_or_default();
        Box::pin(async move {
            if host == SERVERS_NAME {
                Ok(addrs)
            } else {
                Err(std::io::Error::other(format!("{host}: no such host")))
            }
        })
    });
    let agent = start_agent(
        &pki,
        servers[0].agent_addr,
        AgentOpts {
            servers: Servers {
                hosts: vec![(SERVERS_NAME.to_string(), port)],
                resolve_every: Some(Duration::from_millis(100)),
                resolver: Some(resolver),
            },
            ..Default::default()
        },
    )
    .await;
    // Three servers announced, two addresses known: two streams.
    agent_count_is(&agent, 2).await;
    assert_eq!(servers[2].handle.agent_streams(), 0);
    // The name now resolves to all three: the next resolution adds the third.
    if let Ok(mut a) = answer.lock() {
        a.push(SocketAddr::from(([127, 0, 0, 3], port)));
    }
    agent_count_is(&agent, 3).await;
    for s in &servers {
        within("the server sees the agent", s.handle.wait_for_agents(1)).await;
        tunnel_works(s, echo).await;
    }
}
