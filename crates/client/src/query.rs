//! Running statements: COM_QUERY with the whole answer buffered (every OK, the last
//! result set's column names and rows).

use crate::{Client, ClientError, ConnError, CONTROL_MAX_PACKET};
use holdfast_wire::caps::CLIENT_DEPRECATE_EOF;
use holdfast_wire::codec::Reader;
use holdfast_wire::command::COM_QUERY;
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};

/// A text result: rows of nullable columns, plus the final OK's status.
#[derive(Debug, Default, Clone)]
pub struct TextResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub status: u16,
    pub affected_rows: u64,
}

/// One OK packet of a statement's answer.
#[derive(Debug, Clone, Default)]
pub struct OkInfo {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    /// The raw session state block (see `SessionRecord::apply_session_state`).
    pub session_state: Vec<u8>,
}

/// A buffered answer to one of holdfast's own statements: the last result set's column
/// names and rows with raw column bytes (no charset decoding), and every OK.
#[derive(Debug, Clone, Default)]
pub struct Executed {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<Vec<u8>>>>,
    pub oks: Vec<OkInfo>,
    /// The status flags of the final OK or EOF.
    pub status: u16,
}

impl Executed {
    /// The rows as text (invalid UTF-8 replaced).
    pub fn text_rows(&self) -> Vec<Vec<Option<String>>> {
        self.rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|c| c.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()))
                    .collect()
            })
            .collect()
    }
}

impl Client {
    /// Runs one statement (COM_QUERY) and buffers its whole answer. For holdfast's own
    /// statements only (control queries, session capture and restore); packets larger than
    /// `max_packet` fail the connection.
    pub async fn execute(
        &mut self,
        sql: &[u8],
        max_packet: usize,
    ) -> Result<Executed, ClientError> {
        let mut cmd = Vec::with_capacity(sql.len() + 1);
        cmd.push(COM_QUERY);
        cmd.extend_from_slice(sql);
        self.conn.write_packet(&cmd, 0).await?;
        let mut m = ResponseMachine::new(
            Expect::ResultSets,
            self.capabilities & CLIENT_DEPRECATE_EOF != 0,
        );
        let mut out = Executed::default();
        let mut definitions_left: u64 = 0;
        let mut error = None;
        while !m.is_done() {
            let p = self.conn.read_packet(max_packet).await?;
            let len = p.payload.len().min(holdfast_wire::frame::MAX_PAYLOAD - 1);
            match m.classify(len, p.payload.first().copied()) {
                Kind::Opaque if definitions_left > 0 => {
                    definitions_left -= 1;
                    out.columns.push(column_name(&p.payload));
                }
                Kind::Opaque => out.rows.push(raw_text_row(&p.payload)),
                Kind::Inspect => match m.on_packet(&p.payload).map_err(ConnError::Wire)? {
                    Event::Err(_) => error = Some(ClientError::from_err_payload(&p.payload)),
                    Event::Ok(ok) => {
                        out.status = ok.status;
                        out.oks.push(OkInfo {
                            affected_rows: ok.affected_rows,
                            last_insert_id: ok.last_insert_id,
                            status: ok.status,
                            session_state: ok.session_state.to_vec(),
                        });
                    }
                    Event::Eof(eof) => out.status = eof.status,
                    Event::None => {
                        // A column count: a new result set starts.
                        out.rows.clear();
                        out.columns.clear();
                        definitions_left =
                            Reader::new(&p.payload).lenenc_int("columns").unwrap_or(0);
                    }
                    Event::LocalInfile => {
                        // holdfast's own statements never ask for a file; answer "no file".
                        self.conn.write_packet(&[], p.seq.wrapping_add(1)).await?;
                    }
                    Event::PrepareOk(_) => {}
                },
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Runs a statement and returns its (last) result as text. For control queries.
    pub async fn query(&mut self, sql: &str) -> Result<TextResult, ClientError> {
        let r = self.execute(sql.as_bytes(), CONTROL_MAX_PACKET).await?;
        Ok(TextResult {
            rows: r.text_rows(),
            status: r.status,
            affected_rows: r.oks.last().map_or(0, |ok| ok.affected_rows),
        })
    }
}

/// Decodes a text-protocol row (lenenc strings, 0xfb for NULL) as text.
pub fn parse_text_row(payload: &[u8]) -> Vec<Option<String>> {
    raw_text_row(payload)
        .into_iter()
        .map(|c| c.map(|b| String::from_utf8_lossy(&b).into_owned()))
        .collect()
}

/// Decodes a text-protocol row keeping each column's bytes.
fn raw_text_row(payload: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut r = Reader::new(payload);
    let mut row = Vec::new();
    while !r.is_empty() {
        if payload.get(r.position()) == Some(&0xfb) {
            let _ = r.u8("null");
            row.push(None);
            continue;
        }
        match r.lenenc_bytes("column") {
            Ok(v) => row.push(Some(v.to_vec())),
            Err(_) => break,
        }
    }
    row
}

/// The `name` of a ColumnDefinition41 (after catalog, schema, table, org_table).
fn column_name(payload: &[u8]) -> String {
    let mut r = Reader::new(payload);
    for what in ["catalog", "schema", "table", "org_table"] {
        if r.lenenc_bytes(what).is_err() {
            return String::new();
        }
    }
    r.lenenc_bytes("name")
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}
