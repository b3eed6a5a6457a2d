//! The `kerze` command line; see `kerze::cli`.

fn main() {
    #[cfg(not(target_arch = "wasm32"))]
    kerze::cli::main();
}
