//! `terraform-provider-sless`: a Terraform provider (plugin protocol 6) for
//! sless queue services and dataflows. Terraform starts it; run by hand it
//! explains that and exits.

mod client;
mod cty;
mod diag;
mod plugin;
mod resource;
mod resources;
mod schema;
mod server;

/// Generated from `proto/`; the message wrappers of each RPC are only namespaces.
mod proto {
    #![allow(clippy::all, clippy::pedantic, dead_code)]
    tonic::include_proto!("tfplugin6");

    pub mod plugin {
        #![allow(clippy::all, clippy::pedantic)]
        tonic::include_proto!("plugin");
    }

    pub mod health {
        #![allow(clippy::all, clippy::pedantic)]
        tonic::include_proto!("grpc.health.v1");
    }
}

use std::io::Write;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::Server;

use proto::health::health_server::HealthServer;
use proto::plugin::{
    grpc_broker_server::GrpcBrokerServer, grpc_controller_server::GrpcControllerServer,
    grpc_stdio_server::GrpcStdioServer,
};
use proto::provider_server::ProviderServer;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var(plugin::MAGIC_COOKIE_KEY).as_deref() != Ok(plugin::MAGIC_COOKIE_VALUE) {
        eprintln!(
            "This binary is a plugin: Terraform runs it. Use it from a Terraform configuration with\n  \
             required_providers {{ sless = {{ source = \"kube5s/sless\" }} }}"
        );
        std::process::exit(1);
    }
    // Terraform reads the plugin's stderr as its log (TF_LOG); stdout is the handshake.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();

    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot listen on loopback")?;
    let addr = listener.local_addr()?;
    let tls = match std::env::var("PLUGIN_CLIENT_CERT") {
        Ok(pem) if !pem.is_empty() => Some(plugin::AutoMtls::new(&pem)?),
        _ => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let router = Server::builder()
        .add_service(ProviderServer::new(server::SlessProvider::default()).max_decoding_message_size(64 << 20))
        .add_service(HealthServer::new(plugin::HealthService))
        .add_service(GrpcControllerServer::new(plugin::Controller(stop_tx)))
        .add_service(GrpcBrokerServer::new(plugin::Broker(stop_rx.clone())))
        .add_service(GrpcStdioServer::new(plugin::Stdio(stop_rx.clone())));

    let line = plugin::handshake_line(addr, tls.as_ref().map(|t| t.server_cert_der.as_slice()));
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    drop(stdout);

    let mut stop = stop_rx.clone();
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    match tls {
        None => {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
                .await?
        }
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config);
            let (conn_tx, conn_rx) = tokio::sync::mpsc::channel(16);
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, conn_tx) = (acceptor.clone(), conn_tx.clone());
                    tokio::spawn(async move {
                        match acceptor.accept(tcp).await {
                            Ok(stream) => {
                                let _ = conn_tx.send(Ok::<_, std::io::Error>(stream)).await;
                            }
                            Err(e) => tracing::debug!(error = %e, "refused a TLS connection"),
                        }
                    });
                }
            });
            router
                .serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), shutdown)
                .await?;
        }
    }
    Ok(())
}
