//! An object store wrapper for tests that change what a store does: every
//! request goes on to a real store, and an [`Interceptor`] decides what
//! happens around the puts, gets and deletes (delay them, refuse them,
//! lose their answers, count them). Everything else passes straight
//! through, so a test writes only the part it changes.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures_core::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What an [`Intercepted`] store does with the requests a test cares
/// about. Each method gets the real store and, by default, forwards.
#[async_trait]
pub trait Interceptor: Send + Sync + 'static {
    /// A put (`put`, `put_opts`): by default passed on unchanged.
    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        inner.put_opts(location, payload, opts).await
    }

    /// A get (`get`, `get_opts`, `head`): by default passed on unchanged.
    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        inner.get_opts(location, options).await
    }

    /// A delete (`delete`, `delete_stream`): by default passed on unchanged.
    fn delete(
        &self,
        inner: &dyn ObjectStore,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        inner.delete_stream(locations)
    }
}

/// A real store behind an [`Interceptor`].
pub struct Intercepted<I> {
    /// The store every request goes on to.
    pub inner: Arc<dyn ObjectStore>,
    /// What happens around the requests.
    pub hooks: I,
}

impl<I> std::ops::Deref for Intercepted<I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.hooks
    }
}

impl<I> fmt::Debug for Intercepted<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Intercepted({})", self.inner)
    }
}

impl<I> fmt::Display for Intercepted<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Intercepted({})", self.inner)
    }
}

#[async_trait]
impl<I: Interceptor> ObjectStore for Intercepted<I> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.hooks
            .put(self.inner.as_ref(), location, payload, opts)
            .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.hooks.get(self.inner.as_ref(), location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.hooks.delete(self.inner.as_ref(), locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Hooks shared with the test that sets them.
#[async_trait]
impl<I: Interceptor> Interceptor for Arc<I> {
    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        I::put(self, inner, location, payload, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        I::get(self, inner, location, options).await
    }

    fn delete(
        &self,
        inner: &dyn ObjectStore,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        I::delete(self, inner, locations)
    }
}
