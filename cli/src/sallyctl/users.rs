//! `sallyctl users`: local users, their roles and logins, and the sign-up tokens they start with.

use anyhow::{Result, bail};
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use crate::http::Api;
use crate::println;

#[derive(Subcommand)]
pub(super) enum UsersCommand {
    /// Create a user and print a one-time sign-up token (valid 1h).
    Add {
        name: String,
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        logins: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// List users.
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Remove a user.
    Rm { name: String },
    /// Replace a user's roles and/or logins.
    Update {
        name: String,
        #[arg(long, value_delimiter = ',')]
        set_roles: Option<Vec<String>>,
        #[arg(long, value_delimiter = ',', num_args = 0..)]
        set_logins: Option<Vec<String>>,
    },
    /// Clear a user's password and authenticator and print a new sign-up token.
    Reset {
        name: String,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

pub(super) fn print_token(t: &SignupToken, format: Format, what: &str) -> Result<()> {
    if format == Format::Json {
        println!(
            "{}",
            serde_json::to_string(
                &serde_json::json!({"user": t.user, "token": t.token, "expires": t.expires})
            )?
        );
    } else {
        println!(
            "User {} {what}. The sign-up token expires at {}.",
            t.user, t.expires
        );
        println!("Send them this command (the token works once):\n");
        println!(
            "  sally signup --proxy PROXY:3080 --token {} --ca-pin PIN\n",
            t.token
        );
        println!("PROXY is the proxy's address and PIN the CA pin `sallyctl status` shows.");
    }
    Ok(())
}

pub(super) async fn users(api: &Api, cmd: &UsersCommand) -> Result<()> {
    match cmd {
        UsersCommand::Add {
            name,
            roles,
            logins,
            format,
        } => {
            let t: SignupToken = api
                .post(
                    routes::auth::USERS,
                    &AddUser {
                        name: name.clone(),
                        roles: roles.clone(),
                        logins: logins.clone(),
                    },
                )
                .await?;
            print_token(&t, *format, "was created")?;
        }
        UsersCommand::Ls { format } => {
            let users: Vec<UserInfo> = api.get(routes::auth::USERS).await?;
            if *format == Format::Json {
                println!("{}", serde_json::to_string_pretty(&users)?);
            } else {
                println!(
                    "{:<24} {:<6} {:<8} {:<28} LOGINS",
                    "USER", "TYPE", "STATUS", "ROLES"
                );
                for u in users {
                    let logins = u
                        .traits
                        .get("internal.logins")
                        .map(|l| l.join(","))
                        .unwrap_or_default();
                    let status = if u.locked_until.is_some() {
                        "locked"
                    } else {
                        u.status.as_str()
                    };
                    println!(
                        "{:<24} {:<6} {:<8} {:<28} {}",
                        u.name,
                        u.user_type,
                        status,
                        u.roles.join(","),
                        logins
                    );
                }
            }
        }
        UsersCommand::Rm { name } => {
            let _: serde_json::Value = api.delete(&routes::auth::user(name)).await?;
            println!("User {name} removed.");
        }
        UsersCommand::Update {
            name,
            set_roles,
            set_logins,
        } => {
            if set_roles.is_none() && set_logins.is_none() {
                bail!("nothing to update: give --set-roles and/or --set-logins");
            }
            let u: UserInfo = api
                .put(
                    &routes::auth::user(name),
                    &UpdateUser {
                        roles: set_roles.clone(),
                        logins: set_logins.clone(),
                    },
                )
                .await?;
            let logins = u
                .traits
                .get("internal.logins")
                .map(|l| l.join(","))
                .unwrap_or_default();
            println!(
                "User {} updated: roles {}; logins {}",
                u.name,
                u.roles.join(","),
                if logins.is_empty() { "(none)" } else { &logins }
            );
        }
        UsersCommand::Reset { name, format } => {
            let t: SignupToken = api
                .post(&routes::auth::user_reset(name), &serde_json::json!({}))
                .await?;
            print_token(&t, *format, "was reset: password and authenticator cleared")?;
        }
    }
    Ok(())
}
