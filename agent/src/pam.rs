//! PAM's account and session stacks for a node session (`ssh_service.pam`), as sshd runs them
//! for a key login: never the auth stack's authentication (the certificate already proved who
//! it is), then `pam_acct_mgmt`, `pam_setcred(PAM_ESTABLISH_CRED)`, `pam_open_session`,
//! `pam_getenvlist`, and at the end `pam_close_session`, `pam_setcred(PAM_DELETE_CRED)`,
//! `pam_end`.
//!
//! libpam is not linked: `libpam.so.0` is opened at run time, only when PAM is enabled, so
//! the agent builds where no PAM headers exist and runs where no PAM is installed. The
//! conversation answers no prompt (`PAM_CONV_ERR`) and keeps what modules say
//! (`PAM_ERROR_MSG`, `PAM_TEXT_INFO`: an account denial's reason, pam_motd's text) for the
//! user. This is one of the agent's few `unsafe` modules: a C library's API.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Mutex;

/// The library every Linux-PAM and OpenPAM installation ships under this soname.
const LIBPAM: &str = "libpam.so.0";

const PAM_SUCCESS: c_int = 0;
const PAM_BUF_ERR: c_int = 5;
const PAM_CONV_ERR: c_int = 19;
const PAM_ERROR_MSG: c_int = 3;
const PAM_TEXT_INFO: c_int = 4;
const PAM_ESTABLISH_CRED: c_int = 0x0002;
const PAM_DELETE_CRED: c_int = 0x0004;
const PAM_TTY: c_int = 3;
const PAM_RHOST: c_int = 4;

/// A conversation message, as Linux-PAM lays it out.
#[repr(C)]
struct PamMessage {
    msg_style: c_int,
    msg: *const c_char,
}

#[repr(C)]
struct PamResponse {
    resp: *mut c_char,
    resp_retcode: c_int,
}

type ConvFn =
    extern "C" fn(c_int, *mut *const PamMessage, *mut *mut PamResponse, *mut c_void) -> c_int;

#[repr(C)]
struct PamConv {
    conv: ConvFn,
    appdata_ptr: *mut c_void,
}

/// An opaque `pam_handle_t`.
#[repr(C)]
struct PamHandle {
    _private: [u8; 0],
}

type StartFn = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const PamConv,
    *mut *mut PamHandle,
) -> c_int;
type FlagsFn = unsafe extern "C" fn(*mut PamHandle, c_int) -> c_int;
type EnvListFn = unsafe extern "C" fn(*mut PamHandle) -> *mut *mut c_char;
type StrErrorFn = unsafe extern "C" fn(*mut PamHandle, c_int) -> *const c_char;
type SetItemFn = unsafe extern "C" fn(*mut PamHandle, c_int, *const c_void) -> c_int;

/// libpam's entry points, resolved once when the library is opened.
struct Api {
    start: StartFn,
    end: FlagsFn,
    acct_mgmt: FlagsFn,
    setcred: FlagsFn,
    open_session: FlagsFn,
    close_session: FlagsFn,
    getenvlist: EnvListFn,
    strerror: StrErrorFn,
    set_item: SetItemFn,
    /// Kept open as long as the pointers above are used.
    _lib: libloading::Library,
}

impl Api {
    fn load() -> Result<Api, String> {
        // SAFETY: opening libpam runs its initialisers, which have no preconditions on us.
        let lib = unsafe { libloading::Library::new(LIBPAM) }
            .map_err(|e| format!("cannot load {LIBPAM} (is PAM installed?): {e}"))?;
        // SAFETY: each type is the function's C prototype from <security/pam_appl.h>; the
        // pointers are used only while `_lib` keeps the library mapped.
        unsafe {
            Ok(Api {
                start: sym(&lib, b"pam_start\0")?,
                end: sym(&lib, b"pam_end\0")?,
                acct_mgmt: sym(&lib, b"pam_acct_mgmt\0")?,
                setcred: sym(&lib, b"pam_setcred\0")?,
                open_session: sym(&lib, b"pam_open_session\0")?,
                close_session: sym(&lib, b"pam_close_session\0")?,
                getenvlist: sym(&lib, b"pam_getenvlist\0")?,
                strerror: sym(&lib, b"pam_strerror\0")?,
                set_item: sym(&lib, b"pam_set_item\0")?,
                _lib: lib,
            })
        }
    }
}

/// # Safety
/// `T` must be the symbol's true function type.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, String> {
    // SAFETY: the caller vouches for `T`.
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|e| format!("{LIBPAM}: {e}"))
}

/// Whether PAM can be used here: the library loads and the service's file exists (without
/// it, PAM would quietly use `/etc/pam.d/other`). Checked when the agent starts, so a
/// misconfigured node says so at once rather than at the first session.
pub fn check(service: &str) -> Result<(), String> {
    if service.is_empty() || service.contains('/') || service.starts_with('.') {
        return Err(format!("PAM service name {service:?} is not a file name"));
    }
    Api::load()?;
    let file = std::path::Path::new("/etc/pam.d").join(service);
    if !file.is_file() {
        return Err(format!(
            "PAM is enabled with service {service:?}, but {} does not exist (an example is \
             config/pam.d/sallyport)",
            file.display()
        ));
    }
    Ok(())
}

/// What PAM's modules said, kept for the user: text (pam_motd) and errors (a denial's reason).
#[derive(Default)]
struct Said {
    messages: Mutex<Vec<String>>,
}

/// The conversation: no prompt is answered (no one is there to answer: the certificate was
/// the authentication), every message is kept.
extern "C" fn converse(
    n: c_int,
    msgs: *mut *const PamMessage,
    resp: *mut *mut PamResponse,
    appdata: *mut c_void,
) -> c_int {
    if n <= 0 || msgs.is_null() || resp.is_null() || appdata.is_null() {
        return PAM_CONV_ERR;
    }
    let n = n as usize;
    // SAFETY: `appdata` is the `Said` that `Session` owns and keeps at a fixed address (boxed)
    // for the handle's whole life.
    let said = unsafe { &*(appdata as *const Said) };
    let mut kept = Vec::new();
    for i in 0..n {
        // SAFETY: Linux-PAM passes an array of `n` pointers to messages valid for this call.
        let m = unsafe { *msgs.add(i) };
        if m.is_null() {
            return PAM_CONV_ERR;
        }
        // SAFETY: as above; `msg` is a NUL-terminated string or NULL.
        let (style, text) = unsafe { ((*m).msg_style, (*m).msg) };
        match style {
            PAM_ERROR_MSG | PAM_TEXT_INFO => {
                if !text.is_null() {
                    // SAFETY: a NUL-terminated string valid for this call.
                    let t = unsafe { CStr::from_ptr(text) }
                        .to_string_lossy()
                        .into_owned();
                    kept.push(t);
                }
            }
            // A prompt (a password, a new one): nobody to ask.
            _ => return PAM_CONV_ERR,
        }
    }
    // PAM frees the responses with free(3): they must come from calloc.
    // SAFETY: calloc with a count and size; checked for NULL below.
    let r = unsafe { nix::libc::calloc(n, std::mem::size_of::<PamResponse>()) };
    if r.is_null() {
        return PAM_BUF_ERR;
    }
    // SAFETY: `resp` is the caller's out-pointer; zeroed responses mean "no answer".
    unsafe { *resp = r as *mut PamResponse };
    if let Ok(mut m) = said.messages.lock() {
        m.extend(kept);
    }
    PAM_SUCCESS
}

/// A PAM transaction for one session.
pub struct Session {
    api: Api,
    handle: *mut PamHandle,
    /// Borrowed by the conversation through `appdata_ptr`: boxed so it never moves, and
    /// dropped after `pam_end` (field order: see Drop).
    said: Box<Said>,
    _conv: Box<PamConv>,
    opened: bool,
    cred: bool,
    status: c_int,
}

impl Session {
    /// `pam_start(service, login)` with the terminal (`PAM_TTY`: the pty's path, or "ssh" as
    /// sshd sets for a session without one) and the user's address (`PAM_RHOST`).
    pub fn start(
        service: &str,
        login: &str,
        tty: Option<&str>,
        rhost: Option<&str>,
    ) -> Result<Session, String> {
        let api = Api::load()?;
        let service_c = CString::new(service).map_err(|_| "NUL in the PAM service name")?;
        let login_c = CString::new(login).map_err(|_| "NUL in the login")?;
        let said = Box::new(Said::default());
        let conv = Box::new(PamConv {
            conv: converse,
            appdata_ptr: &*said as *const Said as *mut c_void,
        });
        let mut handle: *mut PamHandle = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings; `conv` outlives the handle (owned by Session).
        let rc = unsafe { (api.start)(service_c.as_ptr(), login_c.as_ptr(), &*conv, &mut handle) };
        if rc != PAM_SUCCESS || handle.is_null() {
            if !handle.is_null() {
                // SAFETY: the handle pam_start gave back, ended once.
                unsafe { (api.end)(handle, rc) };
            }
            return Err(format!("pam_start failed ({rc})"));
        }
        let mut s = Session {
            api,
            handle,
            said,
            _conv: conv,
            opened: false,
            cred: false,
            status: PAM_SUCCESS,
        };
        let tty = CString::new(tty.unwrap_or("ssh")).map_err(|_| "NUL in the tty name")?;
        s.check(
            // SAFETY: PAM copies the item; the string is valid for the call.
            unsafe { (s.api.set_item)(s.handle, PAM_TTY, tty.as_ptr() as *const c_void) },
        )?;
        if let Some(h) = rhost {
            let h = CString::new(h).map_err(|_| "NUL in the host")?;
            // SAFETY: as above.
            let rc = unsafe { (s.api.set_item)(s.handle, PAM_RHOST, h.as_ptr() as *const c_void) };
            s.check(rc)?;
        }
        Ok(s)
    }

    fn check(&mut self, rc: c_int) -> Result<(), String> {
        if rc == PAM_SUCCESS {
            return Ok(());
        }
        self.status = rc;
        Err(self.strerror(rc))
    }

    fn strerror(&self, rc: c_int) -> String {
        // SAFETY: pam_strerror returns a static string (or NULL) for any code.
        let p = unsafe { (self.api.strerror)(self.handle, rc) };
        if p.is_null() {
            return format!("PAM error {rc}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The account stack: may this login log in now? The error is PAM's words.
    pub fn account(&mut self) -> Result<(), String> {
        // SAFETY: a live handle.
        let rc = unsafe { (self.api.acct_mgmt)(self.handle, 0) };
        self.check(rc)
    }

    /// `pam_setcred(PAM_ESTABLISH_CRED)`. Its failure is not fatal, as in sshd after a key
    /// login (only a PAM-authenticated login makes it so).
    pub fn establish_credentials(&mut self) -> Result<(), String> {
        // SAFETY: a live handle.
        let rc = unsafe { (self.api.setcred)(self.handle, PAM_ESTABLISH_CRED) };
        if rc == PAM_SUCCESS {
            self.cred = true;
            return Ok(());
        }
        Err(self.strerror(rc))
    }

    /// The session stack (pam_limits, pam_env, pam_systemd, pam_motd, ...), in this process.
    pub fn open(&mut self) -> Result<(), String> {
        // SAFETY: a live handle.
        let rc = unsafe { (self.api.open_session)(self.handle, 0) };
        self.check(rc)?;
        self.opened = true;
        Ok(())
    }

    /// The environment the modules set (pam_env, pam_systemd's XDG_*), NAME=value each.
    pub fn environment(&self) -> Vec<(String, String)> {
        // SAFETY: a live handle; the list and its strings are ours to free (malloc'd).
        let list = unsafe { (self.api.getenvlist)(self.handle) };
        let mut env = Vec::new();
        if list.is_null() {
            return env;
        }
        let mut i = 0;
        loop {
            // SAFETY: a NULL-terminated array of NUL-terminated strings.
            let p = unsafe { *list.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: as above.
            let item = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            if let Some((k, v)) = item.split_once('=') {
                env.push((k.to_string(), v.to_string()));
            }
            // SAFETY: each string was malloc'd by libpam for us.
            unsafe { nix::libc::free(p as *mut c_void) };
            i += 1;
        }
        // SAFETY: the array too.
        unsafe { nix::libc::free(list as *mut c_void) };
        env
    }

    /// What the modules said so far (and forgets it).
    pub fn messages(&self) -> Vec<String> {
        self.said
            .messages
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }
}

impl Drop for Session {
    /// Closes what was opened, in sshd's order, then ends the transaction.
    fn drop(&mut self) {
        // SAFETY: a live handle, ended exactly once here; `said` and the conversation are
        // still alive (fields drop after this body).
        unsafe {
            if self.opened {
                (self.api.close_session)(self.handle, 0);
            }
            if self.cred {
                (self.api.setcred)(self.handle, PAM_DELETE_CRED);
            }
            (self.api.end)(self.handle, self.status);
        }
    }
}
