//! Running a statement once through the binary protocol (COM_STMT_PREPARE, EXECUTE,
//! CLOSE), for values the text protocol would lose: integers with their signedness,
//! doubles as their IEEE bytes, strings as raw bytes.

use crate::{Client, ClientError, ConnError};
use holdfast_wire::binary_row::{decode_binary_row, ColumnType};
use holdfast_wire::caps::CLIENT_DEPRECATE_EOF;
use holdfast_wire::caps::MARIADB_CLIENT_EXTENDED_TYPE_INFO;
use holdfast_wire::codec::Reader;
use holdfast_wire::command::{COM_STMT_CLOSE, COM_STMT_EXECUTE, COM_STMT_PREPARE};
use holdfast_wire::frame::MAX_PAYLOAD;
use holdfast_wire::packets::{PrepareOk, EOF_HEADER, ERR_HEADER, OK_HEADER};
use holdfast_wire::WireError;

/// A binary-protocol answer: the column types and the first row's raw values (see
/// [`holdfast_wire::binary_row::decode_binary_row`]); later rows are read and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BinaryResult {
    pub columns: Vec<ColumnType>,
    pub first_row: Option<Vec<Option<Vec<u8>>>>,
}

fn wire(e: WireError) -> ClientError {
    ClientError::Conn(ConnError::Wire(e))
}

impl Client {
    /// Prepares `sql`, executes it once without parameters and no cursor, then closes the
    /// statement whatever the execute gave. Packets larger than `max_packet` fail the
    /// connection. Three round trips (the close has no answer).
    pub async fn execute_prepared(
        &mut self,
        sql: &[u8],
        max_packet: usize,
    ) -> Result<BinaryResult, ClientError> {
        let deprecate_eof = self.capabilities & CLIENT_DEPRECATE_EOF != 0;
        let mut cmd = vec![COM_STMT_PREPARE];
        cmd.extend_from_slice(sql);
        self.conn.write_packet(&cmd, 0).await?;
        let first = self.conn.read_packet(max_packet).await?;
        if first.payload.first() == Some(&ERR_HEADER) {
            return Err(ClientError::from_err_payload(&first.payload));
        }
        let prepared = PrepareOk::parse(&first.payload).map_err(wire)?;
        for count in [prepared.num_params, prepared.num_columns] {
            if count > 0 {
                for _ in 0..count {
                    self.conn.read_packet(max_packet).await?;
                }
                if !deprecate_eof {
                    self.conn.read_packet(max_packet).await?;
                }
            }
        }

        // EXECUTE: id, no cursor, iteration count 1, no parameters.
        let id = prepared.statement_id.to_le_bytes();
        let mut cmd = vec![COM_STMT_EXECUTE];
        cmd.extend_from_slice(&id);
        cmd.push(0);
        cmd.extend_from_slice(&1u32.to_le_bytes());
        self.conn.write_packet(&cmd, 0).await?;
        let outcome = self.read_binary_result(deprecate_eof, max_packet).await;

        let mut cmd = vec![COM_STMT_CLOSE];
        cmd.extend_from_slice(&id);
        self.conn.write_packet(&cmd, 0).await?;
        outcome
    }

    /// Reads a COM_STMT_EXECUTE answer: column definitions, then rows up to the EOF.
    async fn read_binary_result(
        &mut self,
        deprecate_eof: bool,
        max_packet: usize,
    ) -> Result<BinaryResult, ClientError> {
        let first = self.conn.read_packet(max_packet).await?;
        match first.payload.first() {
            Some(&ERR_HEADER) => return Err(ClientError::from_err_payload(&first.payload)),
            Some(&OK_HEADER) => return Err(wire(WireError::Unexpected(0, "a result set"))),
            _ => {}
        }
        let count = Reader::new(&first.payload)
            .lenenc_int("column count")
            .map_err(wire)?;
        let mut out = BinaryResult::default();
        let extended = self.mariadb_caps & MARIADB_CLIENT_EXTENDED_TYPE_INFO != 0;
        for _ in 0..count {
            let p = self.conn.read_packet(max_packet).await?;
            out.columns
                .push(ColumnType::parse_with(&p.payload, extended).map_err(wire)?);
        }
        if !deprecate_eof {
            self.conn.read_packet(max_packet).await?;
        }
        loop {
            let p = self.conn.read_packet(max_packet).await?;
            match p.payload.first().copied() {
                Some(ERR_HEADER) => return Err(ClientError::from_err_payload(&p.payload)),
                // A row may start with 0xfe only when it fills a whole packet.
                Some(EOF_HEADER) if p.payload.len() < MAX_PAYLOAD => return Ok(out),
                Some(0) => {
                    if out.first_row.is_none() {
                        let values = decode_binary_row(&p.payload, &out.columns).map_err(wire)?;
                        out.first_row =
                            Some(values.into_iter().map(|v| v.map(<[u8]>::to_vec)).collect());
                    }
                }
                other => {
                    return Err(wire(WireError::Unexpected(
                        other.unwrap_or(0),
                        "binary result rows",
                    )))
                }
            }
        }
    }
}
