//! The declaration of an enum whose cases have one fixed text form: the WIT case name (or,
//! for the core's own enums, their stored name), which is also how plugins and the core
//! store the case and how JSON spells it.

/// Declares such an enum with `ALL`, `as_str`, `parse` and `Display`, and (the kit's feature
/// `serde`) serde under the same spelling. Exported for the core, whose own enums follow
/// the same rule; serde is reached through the kit, so a user needs no serde of its own.
#[macro_export]
macro_rules! wire_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $crate::__wire_enum_type! {
            $(#[$meta])* $name { $($(#[$vmeta])* $variant => $text,)+ }
        }

        impl $name {
            /// Every case, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The wire spelling: the stored, displayed and JSON form.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }

            /// The case a wire spelling names; `None` for anything else.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// The enum itself, with serde: decided by the kit's feature here, where `cfg` reads the
/// kit's features rather than the caller's.
#[cfg(feature = "serde")]
#[doc(hidden)]
#[macro_export]
macro_rules! __wire_enum_type {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash,
            $crate::__serde::Serialize, $crate::__serde::Deserialize,
        )]
        #[serde(crate = "pooler_plugin_kit::__serde")]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }
    };
}

/// The enum itself, without serde.
#[cfg(not(feature = "serde"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __wire_enum_type {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }
    };
}
