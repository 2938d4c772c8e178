//! In a fleet (`[cluster]`), the cluster's operations (switchover, failover, rejoin,
//! restart, resize) are the leader's: a member that does not lead forwards them to the
//! leader's admin API (found in etcd, with this member's token: the members share it) and
//! answers with what the leader answered.

use crate::client::{AdminClient, FORWARDED_HEADER};
use crate::{error_answer, MAX_BODY};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use holdfast_config::AdminToken;
use holdfast_proxy::Shared;
use std::sync::Arc;

pub(crate) async fn to_the_leader(
    State((shared, token)): State<(Arc<Shared>, AdminToken)>,
    request: Request,
    next: Next,
) -> Response {
    let Some(fleet) = shared.fleet.clone() else {
        return next.run(request).await;
    };
    if fleet.leadership().borrow().leader {
        return next.run(request).await;
    }
    if request.headers().contains_key(FORWARDED_HEADER) {
        return error_answer(
            StatusCode::CONFLICT,
            format!(
                "member {} of fleet {} does not lead it (a forwarded operation is not forwarded again); ask again",
                fleet.member(),
                fleet.name()
            ),
        );
    }
    let Some(leader) = fleet.leader().await else {
        return error_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no member of fleet {} leads now (or etcd does not say): the operation was not run; ask again",
                fleet.name()
            ),
        );
    };
    let method = request.method().to_string();
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path().to_string(), |p| p.to_string());
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error_answer(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
    };
    let json = (!body.is_empty()).then(|| String::from_utf8_lossy(&body).into_owned());
    tracing::info!(%method, %path, leader = %leader.member, admin = %leader.admin, "fleet: an operation forwarded to the leader");
    let client = AdminClient::new(leader.admin.clone(), Some(token)).forwarding();
    match client.request(&method, &path, json.as_deref()).await {
        Ok((status, text)) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(text),
        )
            .into_response(),
        Err(e) => error_answer(
            StatusCode::BAD_GATEWAY,
            format!(
                "the fleet's leader {} ({}) did not answer: {e}; the operation may not have run",
                leader.member, leader.admin
            ),
        ),
    }
}
