// The forwarders' user-assigned identity. User-assigned (not each VM's system identity) so one
// set of role assignments covers every VM and scale set, and attaching it to a VM needs no
// new role assignment for the identity (whoever attaches it needs
// Microsoft.ManagedIdentity/userAssignedIdentities/assign/action on it: docs/deploy.md).

@description('Azure region of the identity.')
param location string

@description('Name of the identity.')
param name string

@description('Tags for every resource.')
param tags object = {}

resource forwarderIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

@description('Resource id (attach it to VMs and scale sets).')
output id string = forwarderIdentity.id

@description('Client id (AZURE_CLIENT_ID on the VMs).')
output clientId string = forwarderIdentity.properties.clientId

@description('Principal (object) id, for role assignments.')
output principalId string = forwarderIdentity.properties.principalId
