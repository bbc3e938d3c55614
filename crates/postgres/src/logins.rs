//! The `web_logins` table: the web UI's sign-ins, each bound to the key it was made with, so
//! a rotated or removed key ends it; and `sso_states` (schema_v15.sql), single sign-on
//! attempts, each taken once (`DELETE … RETURNING`, so of two replicas one gets it).

use async_trait::async_trait;

use crate::{PgStore, execute, query_opt, sql, users};
use sandboxd_core::store::{Login, Logins, NewLogin, SsoState, StoreError};

#[async_trait]
impl Logins for PgStore {
    async fn add_login(&self, login: NewLogin) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(sql)?;
        // Expired sign-ins go whenever a new one is made: the table stays small without a
        // reaper of its own.
        execute(
            &tx,
            "DELETE FROM web_logins WHERE expires_at <= $1",
            &[&login.created_at],
        )
        .await?;
        let n = execute(
            &tx,
            "INSERT INTO web_logins (token_hash, user_id, key_hash, csrf, created_at, expires_at)
             SELECT $1, id, key_hash, $3, $4, $5 FROM users WHERE id = $2",
            &[
                &login.token_hash.as_slice(),
                &login.user_id,
                &login.csrf,
                &login.created_at,
                &login.expires_at,
            ],
        )
        .await?;
        if n == 0 {
            return Err(StoreError::Sql(format!(
                "user {} vanished while signing in",
                login.user_id
            )));
        }
        tx.commit().await.map_err(sql)
    }

    async fn login(&self, token_hash: [u8; 32], now: i64) -> Result<Option<Login>, StoreError> {
        let client = self.client().await?;
        // The user as of now, and only while they hold the key the sign-in was made with.
        let statement = format!(
            "SELECT {}, l.csrf, l.expires_at FROM web_logins l
             JOIN users u ON u.id = l.user_id AND u.key_hash = l.key_hash
             WHERE l.token_hash = $1 AND l.expires_at > $2",
            users::COLS
        );
        let row = query_opt(&client, &statement, &[&token_hash.as_slice(), &now]).await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(Login {
            user: users::from_row(&r)?,
            csrf: crate::col(&r, 9)?,
            expires_at: crate::col(&r, 10)?,
        }))
    }

    async fn remove_login(&self, token_hash: [u8; 32]) -> Result<(), StoreError> {
        let client = self.client().await?;
        execute(
            &client,
            "DELETE FROM web_logins WHERE token_hash = $1",
            &[&token_hash.as_slice()],
        )
        .await?;
        Ok(())
    }

    async fn add_sso_state(&self, state: SsoState) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(sql)?;
        execute(
            &tx,
            "DELETE FROM sso_states WHERE expires_at <= $1",
            &[&state.created_at],
        )
        .await?;
        execute(
            &tx,
            "INSERT INTO sso_states (state_hash, pkce_verifier, nonce, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                &state.state_hash.as_slice(),
                &state.pkce_verifier,
                &state.nonce,
                &state.created_at,
                &state.expires_at,
            ],
        )
        .await?;
        tx.commit().await.map_err(sql)
    }

    async fn take_sso_state(
        &self,
        state_hash: [u8; 32],
        now: i64,
    ) -> Result<Option<SsoState>, StoreError> {
        let client = self.client().await?;
        let row = query_opt(
            &client,
            "DELETE FROM sso_states WHERE state_hash = $1
             RETURNING pkce_verifier, nonce, created_at, expires_at",
            &[&state_hash.as_slice()],
        )
        .await?;
        let Some(r) = row else {
            return Ok(None);
        };
        let state = SsoState {
            state_hash,
            pkce_verifier: crate::col(&r, 0)?,
            nonce: crate::col(&r, 1)?,
            created_at: crate::col(&r, 2)?,
            expires_at: crate::col(&r, 3)?,
        };
        Ok((state.expires_at > now).then_some(state))
    }
}
